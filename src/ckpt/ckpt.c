/*
 * ckpt.c — checkpoint directories: find the newest "<prefix><step>.safetensors" and prune old
 * ones (below a given step, so that another run's newer files never push out the caller's). The
 * step is read from the file name only (no file is opened), so these are cheap enough to call every
 * save. Temporary files of an interrupted save ("….tmp.<host>.<pid>") never match the name pattern;
 * ddp_ckpt_clean_stale removes those this host's dead processes left, and leaves other hosts'
 * alone, since on a shared filesystem another host may still be writing one.
 */
#define _GNU_SOURCE
#include "ddp/ckpt.h"

#include <dirent.h>
#include <signal.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

#define SUFFIX ".safetensors"

/* The step of "<prefix><digits>.safetensors"; false for any other name. */
static bool match_name(const char *name, const char *prefix, uint64_t *step)
{
    size_t plen = strlen(prefix);
    if (strncmp(name, prefix, plen) != 0)
        return false;
    const char *p = name + plen;
    uint64_t v = 0;
    size_t nd = 0;
    for (; *p >= '0' && *p <= '9'; p++, nd++) {
        if (nd == 18) /* more digits than any real step: not ours */
            return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (nd == 0 || strcmp(p, SUFFIX) != 0)
        return false;
    *step = v;
    return true;
}

typedef struct {
    uint64_t step;
    char *name;
} entry;

/* Newest first; equal steps ("ckpt_7", "ckpt_07") ordered by name so the choice is stable. */
static int cmp_entry(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    if (x->step != y->step)
        return x->step > y->step ? -1 : 1;
    return strcmp(y->name, x->name);
}

static void free_entries(entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(e[i].name);
    free(e);
}

/* The message for an opendir(dir) that failed with errno e. A file where the directory should
 * be gets its own words: strerror's "Not a directory" read as if a parent were missing. */
static ddp_status opendir_err(ddp_error *err, const char *dir, int e)
{
    struct stat sb;
    if (e == ENOTDIR && stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return ddp__err(err, DDP_ERR_SYSTEM,
                        "checkpoint directory '%s' is a file, not a directory; move the file "
                        "away (checkpoints go in a directory of that name) or use another "
                        "directory",
                        dir);
    return ddp__err(err, e == ENOENT ? DDP_ERR_NOT_FOUND : DDP_ERR_SYSTEM,
                    "cannot open checkpoint directory '%s': %s", dir, strerror(e));
}

/* Lists the matching files of dir, newest first. */
static ddp_status list(const char *dir, const char *prefix, entry **out, size_t *nout,
                       ddp_error *err)
{
    if (!dir || !prefix || strchr(prefix, '/'))
        return ddp__err(err, DDP_ERR_INVALID,
                        "checkpoint directory and prefix are required, and the prefix must not "
                        "contain '/'");
    DIR *d = opendir(dir);
    if (!d)
        return opendir_err(err, dir, errno);
    ddp_status st = DDP_OK;
    entry *e = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno != 0)
                st = ddp__err(err, DDP_ERR_SYSTEM, "cannot read checkpoint directory '%s': %s", dir,
                              strerror(errno));
            break;
        }
        uint64_t step;
        if (!match_name(de->d_name, prefix, &step))
            continue;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            entry *ne = realloc(e, ncap * sizeof *ne);
            if (!ne) {
                st = ddp__err(err, DDP_ERR_NOMEM, "out of memory listing '%s'", dir);
                break;
            }
            e = ne, cap = ncap;
        }
        if (!(e[n].name = strdup(de->d_name))) {
            st = ddp__err(err, DDP_ERR_NOMEM, "out of memory listing '%s'", dir);
            break;
        }
        e[n++].step = step;
    }
    closedir(d);
    if (st != DDP_OK) {
        free_entries(e, n);
        return st;
    }
    if (n > 1)
        qsort(e, n, sizeof *e, cmp_entry);
    *out = e;
    *nout = n;
    return DDP_OK;
}

ddp_status ddp_ckpt_latest(const char *dir, const char *prefix, char *out, size_t cap,
                           ddp_error *err)
{
    if (!out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_ckpt_latest: out is required");
    entry *e;
    size_t n;
    ddp_status st = list(dir, prefix, &e, &n, err);
    if (st != DDP_OK)
        return st;
    if (n == 0) {
        st = ddp__err(err, DDP_ERR_NOT_FOUND, "no checkpoint named '%s<step>" SUFFIX "' in '%s'",
                      prefix, dir);
        goto out_free;
    }
    size_t need = strlen(dir) + 1 + strlen(e[0].name) + 1;
    if (need > cap) {
        st = ddp__err(err, DDP_ERR_TOO_LARGE,
                      "the path of checkpoint '%s' in '%s' needs %zu bytes, the buffer has %zu",
                      e[0].name, dir, need, cap);
        goto out_free;
    }
    ddp__fmt(out, cap, "%s/%s", dir, e[0].name);
out_free:
    free_entries(e, n);
    return st;
}

ddp_status ddp_ckpt_prune(const char *dir, const char *prefix, size_t keep_last_k, ddp_error *err)
{
    return ddp_ckpt_prune_upto(dir, prefix, keep_last_k, UINT64_MAX, err);
}

ddp_status ddp_ckpt_prune_upto(const char *dir, const char *prefix, size_t keep_last_k,
                               uint64_t max_step, ddp_error *err)
{
    if (keep_last_k == 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_ckpt_prune: keep_last_k must be at least 1 (it would delete every "
                        "checkpoint)");
    entry *e;
    size_t n;
    ddp_status st = list(dir, prefix, &e, &n, err);
    if (st != DDP_OK)
        return st;
    /* Newest first: skip those above max_step (never counted, never deleted). */
    size_t first = 0;
    while (first < n && e[first].step > max_step)
        first++;
    for (size_t i = first + keep_last_k; i < n && st == DDP_OK; i++) {
        size_t len = strlen(dir) + strlen(e[i].name) + 2;
        char *p = malloc(len);
        if (!p) {
            st = ddp__err(err, DDP_ERR_NOMEM, "out of memory pruning '%s'", dir);
            break;
        }
        ddp__fmt(p, len, "%s/%s", dir, e[i].name);
        if (unlink(p) != 0 && errno != ENOENT)
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot delete old checkpoint '%s': %s", p,
                          strerror(errno));
        free(p);
    }
    free_entries(e, n);
    return st;
}

/* Whether name is "<prefix><digits>.safetensors.tmp.<host>.<pid>" for this host and a pid that
 * no longer runs. */
static bool stale_tmp(const char *name, const char *prefix, const char *host)
{
    const char *t = strstr(name, SUFFIX ".tmp.");
    if (!t)
        return false;
    size_t stem = (size_t)(t - name) + strlen(SUFFIX);
    char base[512];
    uint64_t step;
    if (stem >= sizeof base)
        return false;
    memcpy(base, name, stem);
    base[stem] = '\0';
    if (!match_name(base, prefix, &step))
        return false;
    const char *h = t + strlen(SUFFIX ".tmp."), *dot = strrchr(h, '.');
    if (!dot || (size_t)(dot - h) != strlen(host) || strncmp(h, host, strlen(host)) != 0)
        return false;
    long long pid;
    if (!ddp__parse_int(dot + 1, 1, 1LL << 30, &pid))
        return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

ddp_status ddp_ckpt_clean_stale(const char *dir, const char *prefix, size_t *removed,
                                ddp_error *err)
{
    if (!dir || !prefix || strchr(prefix, '/'))
        return ddp__err(err, DDP_ERR_INVALID,
                        "checkpoint directory and prefix are required, and the prefix must not "
                        "contain '/'");
    size_t n = 0;
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || strchr(host, '/'))
        snprintf(host, sizeof host, "unknown");
    DIR *d = opendir(dir);
    if (!d) {
        if (removed)
            *removed = 0;
        return errno == ENOENT ? DDP_OK : opendir_err(err, dir, errno);
    }
    ddp_status st = DDP_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!stale_tmp(de->d_name, prefix, host))
            continue;
        char p[4400];
        ddp__fmt(p, sizeof p, "%s/%s", dir, de->d_name);
        if (unlink(p) == 0)
            n++;
        else if (errno != ENOENT)
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot remove the stale temporary file '%s': %s", p,
                          strerror(errno));
    }
    closedir(d);
    if (removed)
        *removed = n;
    return st;
}
