/*
 * prepare.c — derived data files (a decompressed IDX file, token files made from text) are made
 * once per host, by whichever process gets there first, while the others wait: "prepare data on
 * the main process only" without the caller arranging it. Atomic: a temporary file, fsync,
 * rename, fsync of the folder, so a crash never leaves a half-written file under the final name
 * nor undoes a finished write.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/data_int.h"
#include "ddp/world.h"
#include "util/util.h"

#define PREP_DEADLINE_MS (10 * 60 * 1000) /* the wait for another process, without DDP_TIMEOUT */

/* Removes what a killed writer of out left beside it: "<name>.tmp.<pid>" files (name: out's last
 * component, in out's folder; exactly that, then the digits of a pid) whose process is gone
 * (kill(pid, 0): ESRCH). A live process's file (its pid answers, or EPERM: another user's) is
 * left, and so is anything else: housekeeping only, so a folder that cannot be read is no error. */
static void remove_stale_tmps(const char *out)
{
    const char *slash = strrchr(out, '/');
    const char *base = slash ? slash + 1 : out;
    char dir[4200];
    if (!slash)
        ddp__fmt(dir, sizeof dir, ".");
    else if (slash == out)
        ddp__fmt(dir, sizeof dir, "/");
    else
        ddp__fmt(dir, sizeof dir, "%.*s", (int)(slash - out), out);
    size_t blen = strlen(base);
    DIR *d = blen ? opendir(dir) : NULL; /* "dir/": no name, nothing of its own to look for */
    if (!d)
        return;
    const pid_t self = getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, base, blen) != 0 || strncmp(n + blen, ".tmp.", 5) != 0)
            continue;
        const char *digits = n + blen + 5;
        long long pid = 0;
        size_t k = 0;
        for (; digits[k] >= '0' && digits[k] <= '9' && k < 10; k++)
            pid = pid * 10 + (digits[k] - '0');
        /* digits only, as getpid() writes them: no sign, no leading zero, nothing after */
        if (k == 0 || digits[k] != '\0' || digits[0] == '0' || pid > INT32_MAX ||
            (pid_t)pid == self)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
            (void)unlinkat(dirfd(d), n, 0); /* gone already (another writer's clean-up): fine */
    }
    closedir(d);
}

ddp_status ddp_file_write_atomic(const char *out, ddp_file_fill_fn fn, void *ctx, ddp_error *err)
{
    char tmp[4200];
    if (!out || !*out || !fn)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_file_write_atomic: %s",
                        fn ? "no path given" : "no fill function given");
    /* a path that leaves no room for the suffix would give a truncated temporary name */
    if (strlen(out) > sizeof tmp - 32)
        return ddp__err(err, DDP_ERR_INVALID, "cannot write '%.200s…': the path is too long", out);
    remove_stale_tmps(out);
    ddp__fmt(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    /* The file it replaces keeps its permission bits (a chmod on it was lost on every rewrite):
     * made with them (less the umask, so never open to more than the old file), then given them
     * exactly, before anything is written into it. */
    struct stat old;
    const bool had = stat(out, &old) == 0 && S_ISREG(old.st_mode);
    /* One left by an earlier process of this pid (a container's pid 1) is this one's to replace,
     * and open with O_TRUNC would refuse it were it read-only. */
    (void)unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, had ? old.st_mode & 0777 : 0666);
    if (fd < 0)
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot write '%s': %s; check the directory", tmp,
                        strerror(errno));
    /* A file system without modes (vfat) refuses it: the file keeps the mode it was made with.
     * An old file without the owner's write bit (0444) is no obstacle: the descriptor is open. */
    if (had)
        (void)fchmod(fd, old.st_mode & 0777);
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return ddp__err(err, DDP_ERR_NOMEM, "cannot write '%s': %s", tmp, strerror(e));
    }
    ddp_status st = fn(ctx, f, tmp, err);
    errno = 0;
    /* ferror: a write the fill did not check (stdio's error flag stays set) */
    if ((fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0) && st == DDP_OK)
        st = ddp__err(err, DDP_ERR_SYSTEM, "writing '%s' failed: %s%s", tmp,
                      errno ? strerror(errno) : "a write failed",
                      errno == ENOSPC || errno == EDQUOT ? "; free space in its folder" : "");
    if (fclose(f) != 0 && st == DDP_OK)
        st = ddp__err(err, DDP_ERR_SYSTEM, "writing '%s' failed: %s%s", tmp, strerror(errno),
                      errno == ENOSPC || errno == EDQUOT ? "; free space in its folder" : "");
    if (st == DDP_OK && rename(tmp, out) != 0)
        st = ddp__err(err, DDP_ERR_SYSTEM, "cannot rename '%s' to '%s': %s; check the folder", tmp,
                      out, strerror(errno));
    if (st != DDP_OK) {
        unlink(tmp);
        return st;
    }
    /* the rename itself made durable, as a checkpoint's save does */
    return ddp__fsync_parent(out, "file", err);
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
