/*
 * errfile.c — why ddptrain failed, for the launcher: TORCHELASTIC_ERROR_FILE.
 *
 * torchrun and ddprun give each worker a path of its own there; a worker that fails writes its
 * error into it (torchelastic's JSON, libddp's ddp_errfile_write), and the launcher's failure
 * summary shows that message, e.g. a bad data file on rank 1, rather than an exit code alone.
 *
 * ddptrain says what failed in a line "ddptrain: …" on stderr, from some eighty places (the
 * config checks, the data, trainer_die, …), often followed by "ddptrain: HINT: …" lines. Rather
 * than have each of them also note its message, stderr is passed through a stream that writes
 * everything on to file descriptor 2 at once, as before, and keeps the last such block: its first
 * line is the message, the whole block (with its HINT and indented lines) the "traceback".
 * main() writes it when it returns non-zero. Warnings ("ddptrain: warning: …") start no block. What
 * is written to fd 2 directly (not through stdio's stderr) is not seen, and a rank that dies of a
 * signal writes nothing here, as a Python worker killed by one does not — except a SIGBUS in a
 * mapped data file or checkpoint, whose handler (busfault.c) writes the error file itself.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddptrain.h"

/* The last error block printed. Written by stdio's stderr (under its lock), read in main at the
 * end, after every thread that could print has been joined. */
static struct {
    char block[sizeof(((ddp_errfile *)0)->traceback)];
    size_t len;
    char line[1024]; /* the line being written */
    size_t line_len; /* a longer line keeps its first sizeof line - 1 bytes */
} said;

static void take_line(void)
{
    static const char prefix[] = "ddptrain: ";
    const char *l = said.line;
    size_t n = said.line_len;
    bool ours = n >= sizeof prefix - 1 && !memcmp(l, prefix, sizeof prefix - 1);
    bool hint = ours && !strncmp(l + sizeof prefix - 1, "HINT", 4);
    bool warning = ours && !strncmp(l + sizeof prefix - 1, "warning", 7);
    if (warning)
        return;
    if (ours && !hint)
        said.len = 0; /* a new error: the block starts again */
    else if (said.len == 0 || !(hint || (n && (l[0] == ' ' || l[0] == '\t'))))
        return; /* a HINT or an indented line goes with the error before it; others are not ours */
    size_t room = sizeof said.block - 1 - said.len;
    size_t k = n + 1 <= room ? n : room ? room - 1 : 0;
    memcpy(said.block + said.len, l, k);
    said.len += k;
    if (said.len + 1 < sizeof said.block)
        said.block[said.len++] = '\n';
    said.block[said.len] = '\0';
}

static ssize_t tee_write(void *cookie, const char *buf, size_t size)
{
    (void)cookie;
    for (size_t off = 0; off < size;) {
        ssize_t k = write(STDERR_FILENO, buf + off, size - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break; /* a closed stderr must not stop the trainer; the block is still kept */
        off += (size_t)k;
    }
    for (size_t i = 0; i < size; i++) {
        if (buf[i] == '\n') {
            take_line();
            said.line_len = 0;
        } else if (said.line_len < sizeof said.line - 1) {
            said.line[said.line_len++] = buf[i];
        }
    }
    return (ssize_t)size;
}

void trainer_errfile_start(void)
{
    cookie_io_functions_t io = {.write = tee_write};
    FILE *f = fopencookie(NULL, "w", io);
    if (!f)
        return;                  /* stderr as it was: only the error file is lost */
    setvbuf(f, NULL, _IONBF, 0); /* as stderr: every message reaches fd 2 when printed */
    fflush(stderr);
    stderr = f;
}

void trainer_errfile_finish(int rc)
{
    fflush(stderr);
    if (said.line_len) { /* a last line without its newline */
        take_line();
        said.line_len = 0;
    }
    const char *path = getenv("TORCHELASTIC_ERROR_FILE");
    if (rc == 0 || !path || !*path || said.len == 0)
        return;
    ddp_errfile *e = calloc(1, sizeof *e);
    if (!e)
        return;
    const char *nl = strchr(said.block, '\n');
    size_t first = nl ? (size_t)(nl - said.block) : strlen(said.block);
    snprintf(e->message, sizeof e->message, "%.*s", (int)first, said.block);
    if (nl && nl[1]) /* more than one line: the block with its HINTs */
        snprintf(e->traceback, sizeof e->traceback, "%s", said.block);
    ddp_error err = {0};
    if (ddp_errfile_write(path, e, &err) != DDP_OK)
        fprintf(stderr, "ddptrain: warning: could not write the error file for the launcher: %s\n",
                err.msg);
    free(e);
}
