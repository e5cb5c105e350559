/*
 * test_errfile.c — torchelastic error files (ddp/errfile.h): what ddp_errfile_write() writes is
 * what PyTorch's ErrorHandler writes (checked field by field with jansson) and reads back;
 * PyTorch's own files, both forms, read; and files a launcher must survive (garbage, JSON of
 * another shape, empty, huge, a FIFO, a directory, missing) give a message rather than a crash
 * or a hang. No temporary file is left beside the written one. The signal-safe writer in a real
 * fatal-signal handler, read back the same way.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "ddp/ddp.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s/errfile.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[600];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (unlink(p) != 0)
                rmdir(p);
        }
    if (d)
        closedir(d);
    return rmdir(dir);
}

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", dir, name);
}

static void put(const char *name, const char *text)
{
    char p[600];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int entries(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void round_trip(void **state)
{
    (void)state;
    char p[600];
    path_of(p, sizeof p, "error.json");
    ddp_errfile e;
    memset(&e, 0, sizeof e);
    snprintf(e.message, sizeof e.message, "ddptrain: rank 1: data: 'x.bin' is truncated");
    snprintf(e.traceback, sizeof e.traceback, "line one\nHINT: line two");
    ddp_error err = {0};
    long long before = (long long)time(NULL);
    assert_int_equal(ddp_errfile_write(p, &e, &err), DDP_OK);
    assert_int_equal(entries(), 1); /* the temporary file was renamed, not left */

    /* The shape PyTorch's ErrorHandler writes: timestamp a string, no errorCode. */
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    assert_non_null(root);
    json_t *m = json_object_get(root, "message");
    assert_true(json_is_object(m));
    assert_string_equal(json_string_value(json_object_get(m, "message")), e.message);
    json_t *x = json_object_get(m, "extraInfo");
    assert_string_equal(json_string_value(json_object_get(x, "py_callstack")), e.traceback);
    assert_true(json_is_string(json_object_get(x, "timestamp")));
    assert_null(json_object_get(m, "errorCode"));
    json_decref(root);

    ddp_errfile r;
    assert_int_equal(ddp_errfile_read(p, &r, &err), DDP_OK);
    assert_string_equal(r.message, e.message);
    assert_string_equal(r.traceback, e.traceback);
    assert_true(r.timestamp >= before && r.timestamp <= (long long)time(NULL));
    assert_int_equal(r.error_code, 0);

    /* Overwritten whole; an error code and a given timestamp kept; no traceback: none written. */
    memset(&e, 0, sizeof e);
    snprintf(e.message, sizeof e.message, "second \xff byte");
    e.timestamp = 1700000000;
    e.error_code = -9;
    assert_int_equal(ddp_errfile_write(p, &e, &err), DDP_OK);
    assert_int_equal(ddp_errfile_read(p, &r, &err), DDP_OK);
    assert_string_equal(r.message, "second ? byte"); /* not UTF-8: '?' */
    assert_string_equal(r.traceback, "");
    assert_true(r.timestamp == 1700000000);
    assert_int_equal(r.error_code, -9);
    assert_int_equal(entries(), 1);
}

static void torch_files(void **state)
{
    (void)state;
    char p[600];
    ddp_errfile r;
    ddp_error err = {0};
    /* What @record writes for an uncaught exception. */
    put("torch.json", "{\"message\": {\"message\": \"ValueError: bad input on rank 1\", "
                      "\"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n"
                      "  File \\\"t.py\\\", line 3, in <module>\\nValueError: bad input on rank "
                      "1\\n\", \"timestamp\": \"1764081234\"}}}");
    path_of(p, sizeof p, "torch.json");
    assert_int_equal(ddp_errfile_read(p, &r, &err), DDP_OK);
    assert_string_equal(r.message, "ValueError: bad input on rank 1");
    assert_non_null(strstr(r.traceback, "Traceback (most recent call last):\n  File"));
    assert_true(r.timestamp == 1764081234);
    /* The newer form, a plain string. */
    put("new.json", "{\"message\": \"RuntimeError: x\", \"timestamp\": 1764081000}");
    path_of(p, sizeof p, "new.json");
    assert_int_equal(ddp_errfile_read(p, &r, &err), DDP_OK);
    assert_string_equal(r.message, "RuntimeError: x");
    assert_true(r.timestamp == 1764081000);
    /* No extraInfo: a message, time unknown. */
    put("bare.json", "{\"message\": {\"message\": \"m\"}}");
    path_of(p, sizeof p, "bare.json");
    assert_int_equal(ddp_errfile_read(p, &r, &err), DDP_OK);
    assert_string_equal(r.message, "m");
    assert_true(r.timestamp == 0);
}

static void expect_refused(const char *name, ddp_status want, const char *words)
{
    char p[600];
    path_of(p, sizeof p, name);
    ddp_errfile r;
    ddp_error err = {0};
    assert_int_equal(ddp_errfile_read(p, &r, &err), want);
    assert_int_equal(err.status, want);
    if (!strstr(err.msg, words) || !strstr(err.msg, name))
        fail_msg("'%s': message '%s' lacks '%s' or the file's name", name, err.msg, words);
}

static void bad_files(void **state)
{
    (void)state;
    put("garbage.json", "this is \x01 not json {");
    expect_refused("garbage.json", DDP_ERR_PROTOCOL, "is not JSON");
    put("empty.json", "");
    expect_refused("empty.json", DDP_ERR_PROTOCOL, "is empty");
    put("shape.json", "[1, 2, 3]");
    expect_refused("shape.json", DDP_ERR_PROTOCOL, "not an error file");
    put("nomsg.json", "{\"message\": {\"extraInfo\": {}}}");
    expect_refused("nomsg.json", DDP_ERR_PROTOCOL, "not an error file");
    expect_refused("missing.json", DDP_ERR_NOT_FOUND, "no error file");

    char p[600];
    path_of(p, sizeof p, "huge.json");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    assert_int_equal(fseek(f, DDP_ERRFILE_MAX_BYTES + 10, SEEK_SET), 0);
    fputc('}', f);
    fclose(f);
    expect_refused("huge.json", DDP_ERR_TOO_LARGE, "bytes");

    /* A FIFO nobody writes: refused at once (an open for reading would wait for a writer). */
    path_of(p, sizeof p, "fifo.json");
    assert_int_equal(mkfifo(p, 0600), 0);
    expect_refused("fifo.json", DDP_ERR_PROTOCOL, "not a regular file");
    path_of(p, sizeof p, "dir.json");
    assert_int_equal(mkdir(p, 0700), 0);
    expect_refused("dir.json", DDP_ERR_PROTOCOL, "not a regular file");
}

static void write_fails(void **state)
{
    (void)state;
    ddp_errfile e;
    memset(&e, 0, sizeof e);
    snprintf(e.message, sizeof e.message, "m");
    ddp_error err = {0};
    char p[600];
    path_of(p, sizeof p, "no/such/dir/error.json");
    assert_int_equal(ddp_errfile_write(p, &e, &err), DDP_ERR_SYSTEM);
    assert_non_null(strstr(err.msg, "no/such/dir/error.json.tmp."));
    /* A directory in the way of the rename: the temporary file goes. */
    path_of(p, sizeof p, "taken");
    assert_int_equal(mkdir(p, 0700), 0);
    char inside[700];
    snprintf(inside, sizeof inside, "%s/x", p);
    put("taken/x", "x");
    assert_int_equal(ddp_errfile_write(p, &e, &err), DDP_ERR_SYSTEM);
    assert_non_null(strstr(err.msg, "cannot rename"));
    assert_int_equal(entries(), 1);
    unlink(inside);
    assert_int_equal(ddp_errfile_write("", &e, &err), DDP_ERR_INVALID);
}

/* ddp_errfile_write_from_signal, called where it is meant to be: in a child's fatal-signal
 * handler, which then dies of the signal. What it wrote reads back as ddp_errfile_write's files
 * do: the same JSON shape, every escape, UTF-8 kept and what is not UTF-8 as '?'. */
static char sig_path[600];
static const char sig_msg[] = "ddptrain: rank 0: the data file '/d/\"q\"\\b\tt\x01 é€😀' shrank";
static const char sig_tb[] =
    "line one\nddptrain: HINT: bad \xff \x80 \xc0\xaf \xed\xa0\x80 end \xe2\x82";

static void on_signal(int sig)
{
    ddp_errfile_write_from_signal(sig_path, sig_msg, sig_tb);
    raise(sig); /* SA_RESETHAND: the default action, death by sig */
}

static void from_signal(void **state)
{
    (void)state;
    path_of(sig_path, sizeof sig_path, "sig.json");
    long long before = (long long)time(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESETHAND;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, NULL);
        raise(SIGBUS);
        _exit(3); /* not reached */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS);
    assert_int_equal(entries(), 1); /* renamed: no temporary file */

    json_error_t je;
    json_t *root = json_load_file(sig_path, 0, &je);
    assert_non_null(root);
    json_t *m = json_object_get(root, "message");
    assert_true(json_is_object(m));
    assert_string_equal(json_string_value(json_object_get(m, "message")), sig_msg);
    json_t *x = json_object_get(m, "extraInfo");
    assert_true(json_is_string(json_object_get(x, "timestamp")));
    json_decref(root);

    ddp_errfile r;
    ddp_error err = {0};
    assert_int_equal(ddp_errfile_read(sig_path, &r, &err), DDP_OK);
    assert_string_equal(r.message, sig_msg);
    assert_string_equal(r.traceback, "line one\nddptrain: HINT: bad ? ? ?? ??? end ??");
    assert_true(r.timestamp >= before && r.timestamp <= (long long)time(NULL));

    /* no traceback: none written; failures: a status and errno, no temporary file left */
    assert_int_equal(ddp_errfile_write_from_signal(sig_path, "only", NULL), DDP_OK);
    assert_int_equal(ddp_errfile_read(sig_path, &r, &err), DDP_OK);
    assert_string_equal(r.message, "only");
    assert_string_equal(r.traceback, "");
    char p[600];
    path_of(p, sizeof p, "no/such/dir/error.json");
    errno = 0;
    assert_int_equal(ddp_errfile_write_from_signal(p, "m", NULL), DDP_ERR_SYSTEM);
    assert_int_equal(errno, ENOENT);
    path_of(p, sizeof p, "taken");
    assert_int_equal(mkdir(p, 0700), 0);
    put("taken/x", "x");
    assert_int_equal(ddp_errfile_write_from_signal(p, "m", NULL), DDP_ERR_SYSTEM);
    assert_int_equal(entries(), 2); /* sig.json, taken/ */
    assert_int_equal(ddp_errfile_write_from_signal("", "m", NULL), DDP_ERR_INVALID);
    assert_int_equal(ddp_errfile_write_from_signal(sig_path, NULL, NULL), DDP_ERR_INVALID);
    path_of(p, sizeof p, "taken/x");
    unlink(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(torch_files, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_files, setup, teardown),
        cmocka_unit_test_setup_teardown(write_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(from_signal, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
