/*
 * ddp/errfile.h — a failed process's error file, in torchelastic's format.
 *
 * torchrun and ddprun give each worker its own path in TORCHELASTIC_ERROR_FILE. A worker that
 * fails writes why there before it exits (PyTorch's @record decorator does it for an uncaught
 * Python exception; ddptrain for its own errors), and the launcher shows that message in its
 * failure summary instead of an exit code alone. The file is JSON:
 *
 *   {"message": {"message": "ValueError: bad input",
 *                "extraInfo": {"py_callstack": "Traceback …", "timestamp": "1764081234"},
 *                "errorCode": 1}}
 *
 * (errorCode only in the copy a launcher makes for its own parent). PyTorch's newer form with a
 * plain string, {"message": "…", "timestamp": 1764081234}, is read too. The library reads no
 * environment here: the caller passes the path (getenv("TORCHELASTIC_ERROR_FILE")).
 */
#ifndef DDP_ERRFILE_H
#define DDP_ERRFILE_H

#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest error file ddp_errfile_read() reads; a larger one is refused unread. */
#define DDP_ERRFILE_MAX_BYTES (1 << 20)

/* Plain data: what one error file says. Strings are NUL-terminated and cut to their field. */
typedef struct ddp_errfile {
    char message[2048];   /* the error in one line or a few: "ValueError: bad input" */
    char traceback[8192]; /* extraInfo.py_callstack (a Python traceback, or a C program's detail
                             lines); "" when none */
    long long timestamp;  /* seconds since the epoch when the error was written; 0: unknown
                             (when writing: now) */
    int error_code;       /* errorCode, the exit code a launcher saw (negative: a signal); 0 none */
} ddp_errfile;

/* Writes e to path in the format above, atomically: a temporary file beside path (path.tmp.PID),
 * then rename(2), so a reader sees the whole file or none. An empty traceback is left out, a
 * timestamp of 0 becomes the current time, an error_code of 0 is left out. Borrows both for the
 * call. Fails (temporary file removed) with DDP_ERR_SYSTEM naming the file and errno, or
 * DDP_ERR_NOMEM; never exits. A caller on its way out should ignore the failure beyond saying it.
 */
ddp_status ddp_errfile_write(const char *path, const ddp_errfile *e, ddp_error *err);

/* The same from a fatal-signal handler, on the process's way out (ddptrain's SIGBUS: the file
 * that shrank under it): async-signal-safe — no allocation, no stdio, no locks; only open(2),
 * write(2), close(2), rename(2), unlink(2), getpid(2) and clock_gettime(2) — into a temporary
 * file path.tmp.PID renamed over path, as ddp_errfile_write. message and traceback
 * (NULL or "": none) are borrowed for the call; the timestamp is now; a byte that does not start
 * a valid UTF-8 character becomes '?' (jansson, the reader, takes UTF-8 only). Reads no
 * environment (getenv is not async-signal-safe): the caller keeps TORCHELASTIC_ERROR_FILE's value
 * from before. Returns DDP_OK; DDP_ERR_INVALID (no path or message, or a path over 4000 bytes);
 * DDP_ERR_SYSTEM with errno saying why (the temporary file removed). It writes no message: a
 * handler has nowhere to put one. */
ddp_status ddp_errfile_write_from_signal(const char *path, const char *message,
                                         const char *traceback);

/* Reads the error file at path into *out (written only on DDP_OK). Never blocks: anything but a
 * regular file (a FIFO, a directory) is refused without being opened for reading. Fails with
 * DDP_ERR_NOT_FOUND when there is no file (the process wrote none), DDP_ERR_TOO_LARGE above
 * DDP_ERRFILE_MAX_BYTES, DDP_ERR_PROTOCOL when it is not JSON or has no message,
 * DDP_ERR_SYSTEM when it cannot be read; err's one line names the file and says why. */
ddp_status ddp_errfile_read(const char *path, ddp_errfile *out, ddp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DDP_ERRFILE_H */
