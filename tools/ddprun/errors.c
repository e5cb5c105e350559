/*
 * errors.c — the workers' error files, as torchrun keeps them.
 *
 * Each worker gets TORCHELASTIC_ERROR_FILE, a path of its own for each attempt: beside its logs
 * under --log_dir (DIR/RUN_ID/attempt_K/LOCAL_RANK/error.json, torchrun's layout), else in a
 * private folder ddprun makes in TMPDIR and removes at the end (torchrun leaves its temporary
 * folder behind). A worker that fails may write why there (PyTorch's @record for an uncaught
 * exception, ddptrain for its own errors: libddp's ddp_errfile_write), and the summary shows the
 * root cause's message and the first lines of its traceback. The files are read with
 * ddp_errfile_read, which refuses what is not a small regular JSON file without blocking, so a
 * garbage or huge file, or a FIFO at the path, is one line in the summary and the job's end goes
 * on. The reaper removes the private folder when ddprun is SIGKILLed. Choosing the root cause (the
 * earliest error) is agent.c's; here are the paths, reading, printing, the copy for ddprun's own
 * parent, the first line shared with the other nodes, and the clean-up.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent_int.h"

#define SHOW_MESSAGE_LINES 5
#define SHOW_TRACE_LINES 10
#define SHOW_LINE_CHARS 200

void agent_error_file_path(agent *a, ddprun_worker *w)
{
    ddprun_opts *o = a->o;
    w->error_file[0] = '\0';
    if (o->want_files) {
        if (!o->log_run_dir[0])
            return;
        snprintf(w->error_file, sizeof w->error_file, "%s/attempt_%d/%d/error.json", o->log_run_dir,
                 a->wd.attempt, w->local_rank);
    } else {
        if (!a->err_dir[0] && !a->err_dir_failed) {
            const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
            snprintf(a->err_dir, sizeof a->err_dir, "%s/ddprun_err_XXXXXX", tmp);
            if (!mkdtemp(a->err_dir)) {
                ddprun_say("cannot create a folder for the workers' error files in '%s': %s; "
                           "they get no TORCHELASTIC_ERROR_FILE (--log_dir DIR keeps them there)",
                           tmp, strerror(errno));
                a->err_dir[0] = '\0';
                a->err_dir_failed = true;
            } else {
                ddprun_reaper_dir(a->reaper_fd, a->err_dir); /* gone with a SIGKILLed ddprun */
            }
        }
        if (!a->err_dir[0])
            return;
        snprintf(w->error_file, sizeof w->error_file, "%s/attempt_%d.local_rank_%d.json",
                 a->err_dir, a->wd.attempt, w->local_rank);
    }
    /* A file from before (a path reused by hand) must not pass for this attempt's. */
    (void)unlink(w->error_file);
}

void agent_read_error_file(agent *a, const ddprun_worker *w)
{
    failure *f = &a->fail;
    snprintf(f->ef_path, sizeof f->ef_path, "%s", w->error_file);
    if (!w->error_file[0]) {
        f->ef_status = DDP_ERR_NOT_FOUND;
        return;
    }
    ddp_error err = {0};
    f->ef_status = ddp_errfile_read(w->error_file, &f->ef, &err);
    if (f->ef_status != DDP_OK)
        snprintf(f->ef_why, sizeof f->ef_why, "%s", err.msg);
}

int64_t agent_error_time(const ddprun_worker *w, bool *from_file)
{
    *from_file = false;
    if (!w->error_file[0])
        return w->exited_wall;
    ddp_errfile *e = malloc(sizeof *e);
    int64_t t = w->exited_wall;
    if (e && ddp_errfile_read(w->error_file, e, NULL) == DDP_OK && e->timestamp > 0) {
        t = e->timestamp;
        *from_file = true;
    }
    free(e);
    return t;
}

/* One line of a worker's text for the console: control characters (an escape sequence in a
 * message) as '?', tabs as spaces, cut to SHOW_LINE_CHARS with "…". */
static void clean_line(char *dst, size_t cap, const char *src, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        if (k >= SHOW_LINE_CHARS) {
            /* not in the middle of a UTF-8 character: a lead byte whose character is cut goes */
            size_t j = k;
            while (j > 0 && ((unsigned char)dst[j - 1] & 0xC0) == 0x80)
                j--;
            if (j > 0 && (unsigned char)dst[j - 1] >= 0xC0) {
                unsigned char lead = (unsigned char)dst[j - 1];
                size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
                if (k - (j - 1) < want)
                    k = j - 1;
            }
            memcpy(dst + k, "…", 3);
            k += 3;
            break;
        }
        dst[k++] = c == '\t' ? ' ' : (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    dst[k] = '\0';
}

/* The lines of text (a last empty line, from a closing "\n", not counted). */
static int count_lines(const char *text)
{
    int n = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        n++;
        if (!nl)
            break;
        p = nl + 1;
    }
    return n;
}

/* Prints up to max lines of text, the first after first_fmt's label and the others after
 * rest_fmt's, then how many were left out. */
static void print_lines(const char *text, int max, const char *first, const char *rest)
{
    int total = count_lines(text), shown = 0;
    char line[SHOW_LINE_CHARS + 8];
    for (const char *p = text; *p && shown < max; shown++) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        clean_line(line, sizeof line, p, n);
        ddprun_say("%s%s", shown ? rest : first, line);
        if (!nl)
            break;
        p = nl + 1;
    }
    if (total > max)
        ddprun_say("%s… %d more line%s in the error file", rest, total - max,
                   total - max == 1 ? "" : "s");
}

void agent_print_error_file(const agent *a)
{
    const failure *f = &a->fail;
    if (!f->local || f->ef_status == 1 || f->ef_status == DDP_ERR_NOT_FOUND)
        return;
    if (f->ef_status != DDP_OK) {
        char why[SHOW_LINE_CHARS * 2 + 8];
        clean_line(why, sizeof why, f->ef_why, strlen(f->ef_why));
        ddprun_say("  error   : error file unreadable: %s", why);
        return;
    }
    const ddp_errfile *e = &f->ef;
    print_lines(e->message[0] ? e->message : "(an empty message)", SHOW_MESSAGE_LINES,
                "  error   : ", "            ");
    char when[64] = "at an unknown time";
    if (e->timestamp > 0) {
        time_t t = (time_t)e->timestamp;
        struct tm tm;
        if (localtime_r(&t, &tm))
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %Z", &tm);
    }
    if (a->err_dir[0])
        ddprun_say("  errfile : written %s (ddprun removes its copy at the end; --log_dir DIR "
                   "keeps it)",
                   when);
    else
        ddprun_say("  errfile : %s (written %s)", f->ef_path, when);
    /* A traceback that only repeats the message says nothing more. */
    size_t ml = strlen(e->message);
    const char *tb = e->traceback;
    bool repeat = !strncmp(tb, e->message, ml) && (tb[ml] == '\0' || !strcmp(tb + ml, "\n"));
    if (!tb[0] || repeat)
        return;
    int total = count_lines(tb);
    if (total > SHOW_TRACE_LINES)
        ddprun_say("  traceback (its first %d of %d lines):", SHOW_TRACE_LINES, total);
    else
        ddprun_say("  traceback:");
    print_lines(tb, SHOW_TRACE_LINES, "    | ", "    | ");
}

void agent_pass_error_file(const agent *a)
{
    const char *mine = getenv("TORCHELASTIC_ERROR_FILE");
    const failure *f = &a->fail;
    if (!mine || !*mine || !f->local || f->ef_status != DDP_OK)
        return; /* torchrun, too, writes none when the root cause wrote none */
    ddp_errfile *e = malloc(sizeof *e);
    if (!e)
        return;
    *e = f->ef;
    /* torchrun's errorCode: the exit code, or minus the signal (Python's Popen returncode) */
    e->error_code = WIFEXITED(f->status)     ? WEXITSTATUS(f->status)
                    : WIFSIGNALED(f->status) ? -WTERMSIG(f->status)
                                             : 0;
    /* torchrun replaces a file already there, saying so: so does ddprun. */
    if (access(mine, F_OK) == 0)
        ddprun_say(
            "TORCHELASTIC_ERROR_FILE '%s' exists already: replacing it with rank %d's error, "
            "as torchrun does",
            mine, f->rank);
    ddp_error err = {0};
    if (ddp_errfile_write(mine, e, &err) != DDP_OK)
        ddprun_say("could not pass rank %d's error on to TORCHELASTIC_ERROR_FILE: %s", f->rank,
                   err.msg);
    free(e);
}

void agent_remove_error_dir(agent *a)
{
    if (!a->err_dir[0])
        return;
    DIR *d = opendir(a->err_dir);
    struct dirent *ent;
    char path[1400];
    while (d && (ent = readdir(d))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, ".."))
            continue;
        /* Only files are made there (a worker's error file and its writer's temporary one). */
        snprintf(path, sizeof path, "%s/%s", a->err_dir, ent->d_name);
        if (unlink(path) != 0 && errno == EISDIR)
            (void)rmdir(path); /* a worker made a folder there: an empty one goes too */
    }
    if (d)
        closedir(d);
    if (rmdir(a->err_dir) != 0)
        ddprun_say("could not remove the error files' folder '%s': %s", a->err_dir,
                   strerror(errno));
    a->err_dir[0] = '\0';
    ddprun_reaper_dir(a->reaper_fd, "");
}

/* "ddprun/a<K>/error/<node>": the first line of node <node>'s failure's error message. A key of
 * its own, not part of the "failed" line: that line's text decides the summary's wording (a node
 * that "stopped responding"), and a worker's message must not. */
void agent_share_error(agent *a, bool store_lost)
{
    failure *f = &a->fail;
    f->remote_error[0] = '\0';
    if (a->o->nnodes == 1 || !f->set || store_lost)
        return;
    char k[128], what[32];
    if (f->local) {
        char msg[SHOW_LINE_CHARS + 8] = "";
        if (f->ef_status == DDP_OK && f->ef.message[0]) {
            const char *m = f->ef.message;
            size_t n = strcspn(m, "\n");
            clean_line(msg, sizeof msg, m, n);
            if (m[n] == '\n' && m[n + 1] && strlen(msg) + 4 < sizeof msg)
                strcat(msg, " …");
        }
        snprintf(what, sizeof what, "error/%d", a->o->node_rank);
        key(k, sizeof k, a, what);
        ddp_store_set_timeout(a->store, 2000);
        (void)ddp_store_set(a->store, k, msg, strlen(msg));
        return;
    }
    /* Only a worker's failure on another node ("rank R (local rank L) on node N ('host') failed
     * …") has a message to fetch; that node writes its key once its own workers are gone: at
     * most its grace period and the 2 s output drain after it saw the failure. */
    int rank, lrank, node;
    if (sscanf(f->line, "rank %d (local rank %d) on node %d (", &rank, &lrank, &node) != 3 ||
        node == a->o->node_rank || node < 0)
        return;
    snprintf(what, sizeof what, "error/%d", node);
    key(k, sizeof k, a, what);
    /* Polled, so that a node whose ddprun died meanwhile (its presence mark, gone/<node>, set by
     * the store when its connection closed) costs no more than the next look. */
    char gone[64];
    snprintf(gone, sizeof gone, "ddprun/gone/%d", node);
    const char *keys[1] = {k}, *gone_keys[1] = {gone};
    int64_t until = now_ms() + (int64_t)(a->o->grace_period * 1000) + 5000;
    ddp_store_set_timeout(a->store, 2000);
    for (;;) {
        bool have = false, dead = false;
        if (ddp_store_check(a->store, keys, 1, &have) != DDP_OK)
            return;
        if (have)
            break;
        if (ddp_store_check(a->store, gone_keys, 1, &dead) != DDP_OK || dead || now_ms() >= until)
            return;
        nap_ms(20);
    }
    void *v = NULL;
    size_t len = 0;
    if (ddp_store_get(a->store, k, &v, &len) == DDP_OK && v) {
        const char *m = v;
        clean_line(f->remote_error, sizeof f->remote_error, m, strnlen(m, len));
    }
    free(v);
}
