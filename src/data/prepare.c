/*
 * prepare.c — derived data files (a decompressed IDX file, token files made from text) are made
 * once per host, by whichever process gets there first, while the others wait: "prepare data on
 * the main process only" without the caller arranging it. Atomic: a temporary file, fsync,
 * rename, so a crash never leaves a half-written file under the final name.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "data/data_int.h"
#include "ddp/world.h"
#include "util/util.h"

#define PREP_DEADLINE_MS (10 * 60 * 1000) /* the wait for another process, without DDP_TIMEOUT */

ddp_status ddp_file_write_atomic(const char *out, ddp_file_fill_fn fn, void *ctx, ddp_error *err)
{
    char tmp[4200];
    if (!out || !*out || !fn)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_file_write_atomic: %s",
                        fn ? "no path given" : "no fill function given");
    /* a path that leaves no room for the suffix would give a truncated temporary name */
    if (strlen(out) > sizeof tmp - 32)
        return ddp__err(err, DDP_ERR_INVALID, "cannot write '%.200s…': the path is too long", out);
    ddp__fmt(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot write '%s': %s; check the directory", tmp,
                        strerror(errno));
    ddp_status st = fn(ctx, f, tmp, err);
    if ((fflush(f) != 0 || fsync(fileno(f)) != 0) && st == DDP_OK)
        st = ddp__err(err, DDP_ERR_SYSTEM, "writing '%s' failed: %s%s", tmp, strerror(errno),
                      errno == ENOSPC || errno == EDQUOT ? "; free space in its folder" : "");
    if (fclose(f) != 0 && st == DDP_OK)
        st = ddp__err(err, DDP_ERR_SYSTEM, "writing '%s' failed: %s%s", tmp, strerror(errno),
                      errno == ENOSPC || errno == EDQUOT ? "; free space in its folder" : "");
    if (st == DDP_OK && rename(tmp, out) != 0)
        st = ddp__err(err, DDP_ERR_SYSTEM, "cannot rename '%s' to '%s': %s; check the folder", tmp,
                      out, strerror(errno));
    if (st != DDP_OK)
        unlink(tmp);
    return st;
}

ddp_status ddp__prepare_once(const char *out, const char *what, ddp__prep_fn fn, void *ctx,
                             ddp_error *err)
{
    if (access(out, R_OK) == 0)
        return DDP_OK;
    char lock[4200];
    ddp__fmt(lock, sizeof lock, "%s.lock", out);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot create '%s': %s", lock, strerror(errno));
    /* The job's deadline (DDP_TIMEOUT) bounds a wait, 10 min without one (10 min whatever it
     * was until 2026-11-26). Read before the first try, so that a bad DDP_* value fails every
     * time, not only when another process holds the lock. */
    ddp_settings set;
    memset(&set, 0, sizeof set);
    ddp_status sst = ddp__settings_from_env(&set, err);
    if (sst != DDP_OK) {
        close(fd);
        return sst;
    }
    const bool from_env = set.timeout_ms > 0;
    const int64_t start = ddp__now_ms(), limit_ms = from_env ? set.timeout_ms : PREP_DEADLINE_MS;
    char limit[32];
    ddp__fmt_duration(limit, sizeof limit, limit_ms);
    bool said = false;
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno; /* before the note's fprintf, which may set it (stderr on /dev/full) */
        if (e != EWOULDBLOCK && e != EINTR) {
            close(fd);
            return ddp__err(err, DDP_ERR_SYSTEM, "cannot lock '%s': %s", lock, strerror(e));
        }
        /* Said once after 5 s (it was silent for up to 10 min, until 2026-11-26): a holder
         * that is stopped or stuck (another job's rank in a debugger) is then found. */
        if (!said && ddp__now_ms() - start > 5000) {
            said = true;
            fprintf(stderr,
                    "ddp: waiting for another process to %s (lock '%s'; up to %s%s): a "
                    "process holding it that is stopped or stuck holds this one up\n",
                    what, lock, limit, from_env ? ", DDP_TIMEOUT" : "");
        }
        if (ddp__now_ms() - start > limit_ms) {
            close(fd);
            /* An flock: a holder that died released it, so removing the file would not help
             * (and would let two writers in); the holder is alive, and lslocks names it. */
            return ddp__err(err, DDP_ERR_TIMEOUT,
                            "waited %s%s for another process to %s: it holds the lock '%s' and "
                            "has not finished; find it with lslocks and end it if it is stopped "
                            "or stuck, or give this job a data cache of its own (DDP_DATA_CACHE); "
                            "DDP_TIMEOUT (seconds) sets how long to wait",
                            limit, from_env ? " (DDP_TIMEOUT)" : "", what, lock);
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    ddp_status st = DDP_OK;
    if (access(out, R_OK) != 0 && /* the first one in prepares; the others find it done */
        (st = ddp_file_write_atomic(out, fn, ctx, err)) != DDP_OK && err &&
        (st == DDP_ERR_SYSTEM || st == DDP_ERR_NOMEM)) {
        char msg[sizeof err->msg];
        memcpy(msg, err->msg, sizeof msg);
        ddp__err(err, st, "%s (ddpc's data cache: DDP_DATA_CACHE names another folder)", msg);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return st;
}
