/*
 * test_text.c — language-model data: text to byte tokens (documents dealt to train/val by
 * position, separator lines kept, folders expanded without links or .dat files, the cached
 * preparation made once by concurrent processes and found again; the atomic write it uses, which
 * ddp_file_write_atomic makes public), windows at arbitrary offsets,
 * and nanoGPT-style random window starts (in range, a function of (seed, step, sample) alone, so
 * 2 ranks × B equal 1 rank × 2B).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ddp/ddp.h"

static char dir[256];

static void put_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

/* How many entries of folder d have part in their name (a temporary file left behind: "tmp"). */
static int names_with(const char *d, const char *part)
{
    DIR *f = opendir(d);
    assert_non_null(f);
    int n = 0;
    for (struct dirent *e; (e = readdir(f));)
        n += strstr(e->d_name, part) != NULL;
    closedir(f);
    return n;
}

/* Reads a uint16 token file back as a string (every token must be a byte). */
static char *tokens_as_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    assert_int_equal(n % 2, 0);
    uint16_t *t = malloc((size_t)n + 2);
    char *s = malloc((size_t)n / 2 + 1);
    assert_int_equal(fread(t, 2, (size_t)n / 2, f), (size_t)n / 2);
    fclose(f);
    for (long i = 0; i < n / 2; i++) {
        assert_true(t[i] < 256);
        s[i] = (char)t[i];
    }
    s[n / 2] = '\0';
    free(t);
    return s;
}

static void test_fortune_split(void **state)
{
    (void)state;
    char folder[300], a[400], b[400], link[400], dat[400], tr[400], va[400];
    snprintf(folder, sizeof folder, "%s/fortunes", dir);
    assert_int_equal(mkdir(folder, 0755), 0);
    snprintf(a, sizeof a, "%s/alpha", folder);
    snprintf(b, sizeof b, "%s/beta.txt", folder);
    snprintf(link, sizeof link, "%s/alpha.u8", folder);
    snprintf(dat, sizeof dat, "%s/alpha.dat", folder);
    put_file(a, "one\n%\ntwo\n%\nthree\n%\n");
    put_file(b, "four\n%\nfive");
    put_file(dat, "\x01\x02binary");
    assert_int_equal(symlink("alpha", link), 0);
    snprintf(tr, sizeof tr, "%s/train.bin", dir);
    snprintf(va, sizeof va, "%s/val.bin", dir);
    ddp_text_opts o = {"%", 2}; /* documents 1 and 3 (two, four) go to validation */
    ddp_text_stats st;
    ddp_error err = {0};
    const char *in[] = {folder};
    assert_int_equal(ddp_tokens_from_text(in, 1, &o, tr, va, &st, &err), DDP_OK);
    assert_int_equal(st.documents, 5);
    char *t = tokens_as_text(tr), *v = tokens_as_text(va);
    assert_string_equal(t, "one\n%\nthree\n%\nfive");
    assert_string_equal(v, "two\n%\nfour\n%\n");
    assert_int_equal(st.train_tokens, strlen(t));
    assert_int_equal(st.val_tokens, strlen(v));
    free(t);
    free(v);

    /* whole files as documents, no validation */
    ddp_text_opts whole = {NULL, 0};
    const char *files[] = {b, a};
    assert_int_equal(ddp_tokens_from_text(files, 2, &whole, tr, NULL, &st, &err), DDP_OK);
    t = tokens_as_text(tr);
    assert_string_equal(t, "four\n%\nfiveone\n%\ntwo\n%\nthree\n%\n");
    free(t);

    /* errors: a missing input, a folder with no text, an empty split; nothing left behind */
    const char *missing[] = {"/nonexistent/text"};
    assert_int_equal(ddp_tokens_from_text(missing, 1, &o, tr, va, NULL, &err), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "/nonexistent/text"));
    char empty[300];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    mkdir(empty, 0755);
    const char *ein[] = {empty};
    assert_int_equal(ddp_tokens_from_text(ein, 1, &o, tr, va, NULL, &err), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "no text files"));
    ddp_text_opts every1 = {"%", 1}; /* everything to validation: training is empty */
    unlink(tr);
    put_file(va, "old"); /* an earlier preparation's validation file stays as it was */
    assert_int_equal(ddp_tokens_from_text(in, 1, &every1, tr, va, NULL, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no training tokens"));
    assert_non_null(strstr(err.msg, "val_every 1"));
    assert_int_not_equal(access(tr, F_OK), 0);
    struct stat vs;
    assert_int_equal(stat(va, &vs), 0);
    assert_int_equal(vs.st_size, 3);

    /* one file without doc_sep is one document: no validation tokens, and the message says
     * how to get some (doc_sep), not only "add text"; still nothing replaced */
    put_file(tr, "older");
    const char *one[] = {a};
    ddp_text_opts whole10 = {NULL, 10};
    assert_int_equal(ddp_tokens_from_text(one, 1, &whole10, tr, va, NULL, &err), DDP_ERR_INVALID);
    assert_non_null(
        strstr(err.msg, "no validation tokens: 1 document (each file is one document)"));
    assert_non_null(strstr(err.msg, "doc_sep"));
    assert_int_equal(stat(va, &vs), 0);
    assert_int_equal(vs.st_size, 3);
    assert_int_equal(stat(tr, &vs), 0);
    assert_int_equal(vs.st_size, 5);

    /* a CRLF file: its separator lines end in "\r\n" */
    char crlf[400];
    snprintf(crlf, sizeof crlf, "%s/crlf.txt", dir);
    put_file(crlf, "one\r\n%\r\ntwo\r\n%\r\nthree\r\n");
    const char *cin[] = {crlf};
    assert_int_equal(ddp_tokens_from_text(cin, 1, &o, tr, va, &st, &err), DDP_OK);
    assert_int_equal(st.documents, 3);
    v = tokens_as_text(va);
    assert_string_equal(v, "two\r\n%\r\n");
    free(v);

    /* empty inputs: said as such */
    char nothing[400];
    snprintf(nothing, sizeof nothing, "%s/nothing.txt", dir);
    put_file(nothing, "");
    const char *none[] = {nothing};
    assert_int_equal(ddp_tokens_from_text(none, 1, &o, tr, va, NULL, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "the text inputs are empty"));

    /* doc_sep: a line break in it could never match (refused), "" is none (as ddptrain's) */
    ddp_text_opts nl = {"%\n", 2}, blank = {"", 0};
    assert_int_equal(ddp_tokens_from_text(in, 1, &nl, tr, va, NULL, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "doc_sep holds a line break"));
    assert_int_equal(ddp_tokens_from_text(files, 2, &blank, tr, NULL, &st, &err), DDP_OK);
    assert_int_equal(st.documents, 2);
}

static void test_prepare_cached_once(void **state)
{
    (void)state;
    char src[300], cache[300];
    snprintf(src, sizeof src, "%s/corpus.txt", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    char big[20000];
    size_t n = 0;
    for (int i = 0; n + 20 < sizeof big; i++)
        n += (size_t)snprintf(big + n, sizeof big - n, "line %d\n%%\n", i);
    put_file(src, big);
    const char *in[] = {src};
    ddp_text_opts o = {"%", 10};
    /* four processes at once: one tokenises, all get the same complete files */
    pid_t kids[4];
    for (int k = 0; k < 4; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            char tr[512], va[512];
            ddp_error e = {0};
            _exit(ddp_tokens_prepare_text(in, 1, &o, cache, tr, va, sizeof tr, &e) == DDP_OK ? 0
                                                                                             : 1);
        }
    }
    for (int k = 0; k < 4; k++) {
        int ws;
        assert_int_equal(waitpid(kids[k], &ws, 0), kids[k]);
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    char tr[512], va[512], tr2[512], va2[512];
    ddp_error err = {0};
    assert_int_equal(ddp_tokens_prepare_text(in, 1, &o, cache, tr, va, sizeof tr, &err), DDP_OK);
    assert_non_null(strstr(tr, cache));
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_tokens(tr, 8, &ds, &err), DDP_OK);
    ddp_text_stats st;
    char d1[400], d2[400];
    snprintf(d1, sizeof d1, "%s/direct-train.bin", dir);
    snprintf(d2, sizeof d2, "%s/direct-val.bin", dir);
    assert_int_equal(ddp_tokens_from_text(in, 1, &o, d1, d2, &st, &err), DDP_OK);
    assert_int_equal(ddp_dataset_num_tokens(ds), st.train_tokens);
    ddp_dataset_close(ds);
    /* a changed option is a different cache entry */
    ddp_text_opts o2 = {"%", 5};
    assert_int_equal(ddp_tokens_prepare_text(in, 1, &o2, cache, tr2, va2, sizeof tr2, &err),
                     DDP_OK);
    assert_string_not_equal(tr, tr2);
    /* the same size rewritten within the same second: a new entry with the new text (the key
     * had the modification time in whole seconds, and gave the old tokens) */
    struct stat before;
    assert_int_equal(stat(src, &before), 0);
    big[5] = 'X'; /* "line X" for "line 0": the same size */
    put_file(src, big);
    struct timespec same[2] = {before.st_atim, before.st_mtim};
    same[1].tv_nsec = (same[1].tv_nsec + 1) % 1000000000;
    assert_int_equal(utimensat(AT_FDCWD, src, same, 0), 0);
    char tr3[512], va3[512];
    assert_int_equal(ddp_tokens_prepare_text(in, 1, &o, cache, tr3, va3, sizeof tr3, &err), DDP_OK);
    assert_string_not_equal(tr, tr3);
    char *t3 = tokens_as_text(tr3);
    assert_memory_equal(t3, "line X\n", 7);
    free(t3);
    /* no temporary or half file is left in the cache */
    assert_int_equal(names_with(cache, "tmp"), 0);
}

/* A fill function for ddp_file_write_atomic: writes ctx's text, then fails when it starts with
 * '!' (after writing, so that a half file exists when the failure comes). */
static ddp_status fill_text(void *ctx, FILE *f, const char *tmp_path, ddp_error *err)
{
    const char *text = ctx;
    if (fputs(text, f) == EOF)
        return ddp_error_set(err, DDP_ERR_SYSTEM, "writing '%s' failed", tmp_path);
    return text[0] == '!' ? ddp_error_set(err, DDP_ERR_INVALID, "fill failed on purpose") : DDP_OK;
}

/* ddp_file_write_atomic, the public form of the write the derived files use: the new contents
 * replace the old at once; a fill that fails, or a folder that is not there, leaves the old file
 * and no temporary one. */
static void test_write_atomic(void **state)
{
    (void)state;
    char path[300], missing[300];
    snprintf(path, sizeof path, "%s/atomic.txt", dir);
    snprintf(missing, sizeof missing, "%s/no-such-folder/x.txt", dir);
    ddp_error err = {0};
    put_file(path, "old contents\n");
    assert_int_equal(ddp_file_write_atomic(path, fill_text, "!half", &err), DDP_ERR_INVALID);
    assert_string_equal(err.msg, "fill failed on purpose");
    char buf[64] = "";
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    assert_string_equal(buf, "old contents\n");
    assert_int_equal(ddp_file_write_atomic(missing, fill_text, "x", &err), DDP_ERR_SYSTEM);
    assert_non_null(strstr(err.msg, "no-such-folder"));
    assert_int_equal(ddp_file_write_atomic(path, NULL, NULL, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_file_write_atomic(path, fill_text, "new\n", &err), DDP_OK);
    f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(buf, sizeof buf, f));
    assert_null(fgets(buf + 4, sizeof buf - 4, f)); /* nothing after it: replaced, not appended */
    fclose(f);
    assert_string_equal(buf, "new\n");
    assert_int_equal(names_with(dir, "atomic.txt.tmp"), 0);
}

/* A rewrite keeps the file's permission bits: a user's chmod (0640, 0604, read-only 0444) was
 * lost before, the new file made 0666 less the umask. */
static void test_write_atomic_keeps_mode(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/mode.txt", dir);
    ddp_error err = {0};
    assert_int_equal(ddp_file_write_atomic(path, fill_text, "first\n", &err), DDP_OK);
    const mode_t modes[] = {0640, 0604, 0444, 0600};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        assert_int_equal(chmod(path, modes[i]), 0);
        assert_int_equal(ddp_file_write_atomic(path, fill_text, "again\n", &err), DDP_OK);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_mode & 07777, modes[i]);
    }
    assert_int_equal(names_with(dir, "mode.txt.tmp"), 0);
}

/* A pid that has ended (a child reaped): what a killed writer's temporary name carries. */
static pid_t dead_pid(void)
{
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0)
        _exit(0);
    assert_int_equal(waitpid(p, NULL, 0), p);
    return p;
}

/* A writer killed mid-rewrite leaves "<path>.tmp.<pid>": the next write of path removes it when
 * the pid is gone, and nothing else: a live process's, another file's, a name with more after
 * the digits or a leading zero, a folder of that name. */
static void test_write_atomic_removes_stale(void **state)
{
    (void)state;
    char path[300], p[400];
    snprintf(path, sizeof path, "%s/stale.txt", dir);
    pid_t dead = dead_pid();
    snprintf(p, sizeof p, "%s.tmp.%d", path, (int)dead);
    put_file(p, "half a file");
    char kept[6][400];
    snprintf(kept[0], sizeof kept[0], "%s.tmp.%d", path, (int)getppid()); /* alive */
    snprintf(kept[1], sizeof kept[1], "%s/other.txt.tmp.%d", dir, (int)dead);
    snprintf(kept[2], sizeof kept[2], "%s.tmp.%d.bak", path, (int)dead);
    snprintf(kept[3], sizeof kept[3], "%s.tmp.0%d", path, (int)dead);
    snprintf(kept[4], sizeof kept[4], "%s.tmp.", path);
    snprintf(kept[5], sizeof kept[5], "%sx.tmp.%d", path, (int)dead);
    for (int i = 0; i < 6; i++)
        put_file(kept[i], "not ours");
    char sub[400];
    snprintf(sub, sizeof sub, "%s.tmp.%d", path, (int)dead_pid());
    assert_int_equal(mkdir(sub, 0755), 0);
    ddp_error err = {0};
    assert_int_equal(ddp_file_write_atomic(path, fill_text, "whole\n", &err), DDP_OK);
    assert_int_equal(access(p, F_OK), -1);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(access(kept[i], F_OK), 0);
        assert_int_equal(unlink(kept[i]), 0);
    }
    assert_int_equal(rmdir(sub), 0);
    assert_int_equal(names_with(dir, "stale.txt"), 1);
}

static void test_windows(void **state)
{
    (void)state;
    char path[400];
    snprintf(path, sizeof path, "%s/tok.bin", dir);
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++)
        tok[i] = (uint16_t)(i % 250);
    FILE *f = fopen(path, "wb");
    fwrite(tok, 2, 1000, f);
    fclose(f);
    ddp_dataset *ds;
    ddp_error err = {0};
    assert_int_equal(ddp_dataset_open_tokens(path, 16, &ds, &err), DDP_OK);
    assert_int_equal(ddp_dataset_num_tokens(ds), 1000);
    uint64_t starts[64];
    ddp_lm_window_starts(7, 3, 0, 64, 1000, 16, starts);
    int32_t x[64 * 16], y[64 * 16];
    assert_int_equal(ddp_dataset_get_windows(ds, starts, 64, x, y, &err), DDP_OK);
    uint64_t maxs = 0;
    for (int k = 0; k < 64; k++) {
        assert_true(starts[k] <= 1000 - 16 - 1);
        maxs = starts[k] > maxs ? starts[k] : maxs;
        for (int j = 0; j < 16; j++) {
            assert_int_equal(x[k * 16 + j], (int32_t)((starts[k] + (uint64_t)j) % 250));
            assert_int_equal(y[k * 16 + j], (int32_t)((starts[k] + (uint64_t)j + 1) % 250));
        }
    }
    assert_true(maxs > 500); /* spread over the file */
    /* 2 ranks × 32 = 1 rank × 64; other steps and seeds differ */
    uint64_t r0[32], r1[32], other[64], seed2[64];
    ddp_lm_window_starts(7, 3, 0, 32, 1000, 16, r0);
    ddp_lm_window_starts(7, 3, 32, 32, 1000, 16, r1);
    assert_memory_equal(r0, starts, sizeof r0);
    assert_memory_equal(r1, starts + 32, sizeof r1);
    ddp_lm_window_starts(7, 4, 0, 64, 1000, 16, other);
    ddp_lm_window_starts(8, 3, 0, 64, 1000, 16, seed2);
    assert_memory_not_equal(other, starts, sizeof other);
    assert_memory_not_equal(seed2, starts, sizeof seed2);
    /* the last full window is allowed, one past it is an error naming it */
    uint64_t last = 1000 - 16 - 1, past = last + 1;
    assert_int_equal(ddp_dataset_get_windows(ds, &last, 1, x, y, &err), DDP_OK);
    assert_int_equal(y[15], (int32_t)(999 % 250));
    assert_int_equal(ddp_dataset_get_windows(ds, &past, 1, x, y, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "984"));
    ddp_dataset_close(ds);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ddp-test-text-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fortune_split),
        cmocka_unit_test(test_prepare_cached_once),
        cmocka_unit_test(test_write_atomic),
        cmocka_unit_test(test_write_atomic_keeps_mode),
        cmocka_unit_test(test_write_atomic_removes_stale),
        cmocka_unit_test(test_windows),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
