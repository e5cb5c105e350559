/*
 * ddp/status.h — status codes and error messages, shared by every part of the library.
 *
 * Every fallible call returns a ddp_status. DDP_OK is zero, errors are negative, so `if (st < 0)`
 * and `if (st != DDP_OK)` both work. A call on a handle records a one-line message on the handle
 * (ddp_store_last_error() and friends); a call that creates a handle writes its message into an
 * optional caller-provided ddp_error, because on failure there is no handle to hold it.
 */
#ifndef DDP_STATUS_H
#define DDP_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddp_status {
    DDP_OK = 0,
    DDP_ERR_INVALID = -1, /* a bad argument, option or environment value */
    DDP_ERR_NOMEM = -2,   /* an allocation failed */
    DDP_ERR_SYSTEM = -3,  /* an operating-system call failed; the message names it and errno */
    DDP_ERR_TIMEOUT = -4, /* a deadline passed; the message says what was waited for and how long */
    DDP_ERR_NETWORK = -5, /* a peer could not be reached or the connection was lost */
    DDP_ERR_AUTH = -6,    /* the peer refused our token, or we refused theirs */
    DDP_ERR_PROTOCOL = -7,    /* a malformed, oversized or unexpected message */
    DDP_ERR_ADDR_IN_USE = -8, /* the address and port to listen on are taken */
    DDP_ERR_NOT_FOUND = -9,   /* a key, file or resource does not exist */
    DDP_ERR_TOO_LARGE = -10,  /* a message or value exceeds a configured limit */
    DDP_ERR_CLOSED = -11,     /* the handle was stopped or aborted */
} ddp_status;

/* A static English name for s ("timeout", "invalid argument", …); never NULL, also for unknown
 * codes. */
const char *ddp_status_str(ddp_status s);

#define DDP_ERRMSG_MAX 512

/* Where a constructor reports why it failed. Plain data, owned by the caller (usually on the
 * stack). On success it is left untouched; on failure status is set and msg holds one line,
 * NUL-terminated. */
typedef struct ddp_error {
    ddp_status status;
    char msg[DDP_ERRMSG_MAX];
} ddp_error;

#if defined(__GNUC__)
#define DDP_PRINTF(fmt_arg, first_arg) __attribute__((format(printf, fmt_arg, first_arg)))
#else
#define DDP_PRINTF(fmt_arg, first_arg)
#endif

/* Records st and a printf-formatted one-line message (truncated to DDP_ERRMSG_MAX − 1 bytes) in
 * err, and returns st, so that `return ddp_error_set(err, DDP_ERR_INVALID, "…", …);` reports and
 * fails in one line. err may be NULL (then only st is returned). The library's own functions
 * write their messages with it; programs built on the library may use it too. */
ddp_status ddp_error_set(ddp_error *err, ddp_status st, const char *fmt, ...) DDP_PRINTF(3, 4);

#ifdef __cplusplus
}
#endif
#endif /* DDP_STATUS_H */
