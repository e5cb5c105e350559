/*
 * test_config.c — the configuration: defaults, YAML (nested maps, lists), command-line
 * overrides in both spellings, precedence, and every error a user can make: unknown keys (with
 * a suggestion), bad values (naming the file and line), bad YAML (line and column); and the
 * YAML the configuration writes of itself reads back as the same values.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ddp/config.h"

static const ddp_cfg_key schema[] = {
    {"lr", DDP_CFG_FLOAT, "0.1", NULL, "learning rate"},
    {"epochs", DDP_CFG_INT, "3", NULL, "epochs"},
    {"amp", DDP_CFG_BOOL, "false", NULL, "mixed precision"},
    {"run_name", DDP_CFG_STRING, "", NULL, "a name"},
    {"lr_scaling", DDP_CFG_CHOICE, "none", "none|linear|sqrt", "scaling"},
    {"model.hidden", DDP_CFG_INT_LIST, "256,128", NULL, "layer sizes"},
    {"model.dropout", DDP_CFG_FLOAT, "0", NULL, "dropout"},
};
#define N (sizeof schema / sizeof schema[0])

static char path[256];

static void write_yaml(const char *text)
{
    snprintf(path, sizeof path, "/tmp/ddp-test-config-%d.yaml", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void defaults_yaml_cli(void **state)
{
    (void)state;
    ddp_config *c;
    ddp_error err = {0};
    assert_int_equal(ddp_config_load(schema, N, NULL, 0, NULL, &c, &err), DDP_OK);
    assert_true(ddp_config_float(c, "lr") == 0.1);
    assert_int_equal(ddp_config_int(c, "epochs"), 3);
    size_t n;
    const int64_t *h = ddp_config_ints(c, "model.hidden", &n);
    assert_int_equal(n, 2);
    assert_int_equal(h[0], 256);
    assert_string_equal(ddp_config_origin(c, "lr"), "default");
    ddp_config_free(c);

    write_yaml("lr: 0.05\nepochs: 7\nmodel:\n  hidden: [512, 256, 64]\n  dropout: 0.2\n"
               "lr_scaling: linear\namp: yes\n");
    char *argv[] = {"--epochs", "9", "--model.dropout=0.5", "--run-name", "x", "--amp=off"};
    assert_int_equal(ddp_config_load(schema, N, path, 6, argv, &c, &err), DDP_OK);
    assert_true(ddp_config_float(c, "lr") == 0.05);   /* from YAML */
    assert_int_equal(ddp_config_int(c, "epochs"), 9); /* CLI wins */
    assert_true(ddp_config_float(c, "model.dropout") == 0.5);
    assert_string_equal(ddp_config_str(c, "run_name"), "x");
    assert_string_equal(ddp_config_str(c, "lr_scaling"), "linear");
    assert_false(ddp_config_bool(c, "amp"));
    h = ddp_config_ints(c, "model.hidden", &n);
    assert_int_equal(n, 3);
    assert_int_equal(h[2], 64);
    char want[300];
    snprintf(want, sizeof want, "%s line 1", path);
    assert_string_equal(ddp_config_origin(c, "lr"), want);
    assert_string_equal(ddp_config_origin(c, "epochs"), "the command line");
    char *y = ddp_config_to_yaml(c);
    assert_non_null(strstr(y, "model.hidden: [512,256,64]\n"));
    assert_non_null(strstr(y, "epochs: 9\n"));
    free(y);
    ddp_config_free(c);
}

static void expect_fail(const char *yaml, int argc, char **argv, const char *a, const char *b)
{
    ddp_config *c = (ddp_config *)0x1;
    ddp_error err = {0};
    if (yaml)
        write_yaml(yaml);
    ddp_status st = ddp_config_load(schema, N, yaml ? path : NULL, argc, argv, &c, &err);
    assert_int_not_equal(st, DDP_OK);
    assert_int_equal(st, err.status);
    assert_ptr_equal(c, (ddp_config *)0x1);
    if (!strstr(err.msg, a) || (b && !strstr(err.msg, b)))
        fail_msg("message '%s' lacks '%s' / '%s'", err.msg, a, b ? b : "");
}

static void errors(void **state)
{
    (void)state;
    char *a1[] = {"--learning_rate", "3"};
    expect_fail(NULL, 2, a1, "unknown key 'learning_rate' (on the command line)", NULL);
    char *a2[] = {"--epoch", "3"};
    expect_fail(NULL, 2, a2, "unknown key 'epoch'", "did you mean 'epochs'?");
    /* a short name every key is 3 edits from: no suggestion ('lr' would mislead) */
    char *a2b[] = {"--foo", "3"};
    expect_fail(NULL, 2, a2b, "unknown key 'foo' (on the command line); --help lists", NULL);
    char *a2c[] = {"--lrr", "3"};
    expect_fail(NULL, 2, a2c, "unknown key 'lrr'", "did you mean 'lr'?");
    char *a3[] = {"--lr", "fast"};
    expect_fail(NULL, 2, a3, "key 'lr': 'fast' is not a number (the command line)", NULL);
    char *a4[] = {"--lr_scaling", "cubic"};
    expect_fail(NULL, 2, a4, "'cubic' is not one of none|linear|sqrt", NULL);
    char *a5[] = {"--epochs"};
    expect_fail(NULL, 1, a5, "option '--epochs' needs a value", NULL);
    char *a6[] = {"train"};
    expect_fail(NULL, 1, a6, "unexpected argument 'train'", NULL);
    expect_fail("lr: 0.1\nepochs: three\n", 0, NULL, "key 'epochs': 'three' is not an integer",
                "line 2");
    expect_fail("model:\n  hiden: [1]\n", 0, NULL, "unknown key 'model.hiden'",
                "did you mean 'model.hidden'?");
    expect_fail("lr: [0.1\nepochs: 2\n", 0, NULL, "line", "fix the YAML");
    /* YAML's reserved indicators cannot start a plain value: say to quote it */
    expect_fail("run_name: %\n", 0, NULL, "line 1 column 11",
                "(a value that starts with '%' must be quoted: \"%…\"); fix the YAML");
    expect_fail("run_name: @home\n", 0, NULL, "must be quoted: \"@…\"", NULL);
    expect_fail("model:\n  hidden: [1, x]\n", 0, NULL, "is not a list of integers", NULL);
    /* a list on the command line: a bracket opened is closed, a number after every comma,
     * nothing after the list (before 2026-11-25 '[512,256' and '512]x' were taken) */
    const char *bad_lists[] = {"[512,256", "512,256]", "[512,256]x", "512,,256", "512,",
                               ",512",     "[,]",      "[[512]]",    "512 256",  "[512]]"};
    for (size_t i = 0; i < sizeof bad_lists / sizeof bad_lists[0]; i++) {
        char *al[] = {"--model.hidden", (char *)bad_lists[i]};
        expect_fail(NULL, 2, al, "is not a list of integers like 256,128 or [256, 128]", NULL);
    }
    const char *good_lists[] = {"512,256", " [ 512 , 256 ] ", "[512,256]", "512, 256 "};
    for (size_t i = 0; i < sizeof good_lists / sizeof good_lists[0]; i++) {
        char *al[] = {"--model.hidden", (char *)good_lists[i]};
        ddp_config *g = NULL;
        ddp_error e = {0};
        if (ddp_config_load(schema, N, NULL, 2, al, &g, &e) != DDP_OK)
            fail_msg("'%s' refused: %s", good_lists[i], e.msg);
        size_t n;
        const int64_t *h = ddp_config_ints(g, "model.hidden", &n);
        assert_int_equal(n, 2);
        assert_true(h[0] == 512 && h[1] == 256);
        ddp_config_free(g);
    }
    ddp_config *c;
    ddp_error err = {0};
    assert_int_equal(ddp_config_load(schema, N, "/no/such.yaml", 0, NULL, &c, &err),
                     DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "cannot open config file '/no/such.yaml'"));
}

/* A float too small to hold exactly (strtod's ERANGE with a subnormal or 0) is a number, as
 * Python's float('1e-320') is; only an overflow is refused, and named as out of range. Before
 * 2026-11-26 '1e-320' was "not a number". */
static void float_underflow_taken_overflow_refused(void **state)
{
    (void)state;
    const char *small[] = {"1e-320", "4.9e-324", "1e-400", "-1e-320"};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        char *a[] = {"--lr", (char *)small[i]};
        ddp_config *c = NULL;
        ddp_error e = {0};
        if (ddp_config_load(schema, N, NULL, 2, a, &c, &e) != DDP_OK)
            fail_msg("'%s' refused: %s", small[i], e.msg);
        assert_true(ddp_config_float(c, "lr") == strtod(small[i], NULL));
        ddp_config_free(c);
    }
    write_yaml("lr: 1e-320\n");
    ddp_config *c = NULL;
    ddp_error err = {0};
    assert_int_equal(ddp_config_load(schema, N, path, 0, NULL, &c, &err), DDP_OK);
    assert_true(ddp_config_float(c, "lr") == 1e-320);
    ddp_config_free(c);
    char *a1[] = {"--lr", "1e999"};
    expect_fail(NULL, 2, a1, "key 'lr': '1e999' is out of range (the command line)",
                "write a finite number");
    char *a2[] = {"--lr", "-1e999"};
    expect_fail(NULL, 2, a2, "'-1e999' is out of range", NULL);
    expect_fail("lr: 1e400\n", 0, NULL, "'1e400' is out of range", "line 1");
    char *a3[] = {"--lr", "nan"};
    expect_fail(NULL, 2, a3, "'nan' is not a number", NULL);
}

/* A key that is also the section of other keys (ddptrain's "checkpoint", a path, beside
 * "checkpoint.every" and "checkpoint.keep"): a YAML map under that name sets the section's keys,
 * as every other nested map does, and a plain value still sets the key itself. Before
 * 2026-11-25 "checkpoint:\n  every: 5" was refused with "expected a single value". */
static void key_and_section_share_a_name(void **state)
{
    (void)state;
    static const ddp_cfg_key sch[] = {
        {"checkpoint", DDP_CFG_STRING, "latest", NULL, "path"},
        {"checkpoint.every", DDP_CFG_INT, "0", NULL, "every"},
        {"checkpoint.keep", DDP_CFG_INT, "3", NULL, "keep"},
        {"lr", DDP_CFG_FLOAT, "0.1", NULL, "learning rate"},
    };
    const size_t n = sizeof sch / sizeof sch[0];
    ddp_config *c;
    ddp_error err = {0};
    write_yaml("checkpoint:\n  every: 5\n  keep: 2\n");
    assert_int_equal(ddp_config_load(sch, n, path, 0, NULL, &c, &err), DDP_OK);
    assert_int_equal(ddp_config_int(c, "checkpoint.every"), 5);
    assert_int_equal(ddp_config_int(c, "checkpoint.keep"), 2);
    assert_string_equal(ddp_config_str(c, "checkpoint"), "latest");
    ddp_config_free(c);
    write_yaml("checkpoint: runs/x/step5.safetensors\ncheckpoint.every: 7\n");
    assert_int_equal(ddp_config_load(sch, n, path, 0, NULL, &c, &err), DDP_OK);
    assert_string_equal(ddp_config_str(c, "checkpoint"), "runs/x/step5.safetensors");
    assert_int_equal(ddp_config_int(c, "checkpoint.every"), 7);
    ddp_config_free(c);
    /* Under the section, a key it lacks is unknown; a map for a key with no section is not a
     * value. */
    write_yaml("checkpoint:\n  evry: 5\n");
    c = (ddp_config *)0x1;
    assert_int_not_equal(ddp_config_load(sch, n, path, 0, NULL, &c, &err), DDP_OK);
    if (!strstr(err.msg, "unknown key 'checkpoint.evry'") ||
        !strstr(err.msg, "did you mean 'checkpoint.every'?"))
        fail_msg("message '%s'", err.msg);
    write_yaml("lr:\n  value: 5\n");
    assert_int_not_equal(ddp_config_load(sch, n, path, 0, NULL, &c, &err), DDP_OK);
    if (!strstr(err.msg, "key 'lr': expected a single value"))
        fail_msg("message '%s'", err.msg);
}

/* What ddp_config_to_yaml writes (into train.log and checkpoints) loads back as the same
 * values: strings with quotes, backslashes, line breaks (YAML folds raw ones), tabs, control
 * and non-ASCII characters; numbers and booleans in any spelling. Found by tests/fuzz/fuzz_config
 * (a multi-line string came back with its line breaks turned into spaces). */
static void to_yaml_reads_back(void **state)
{
    (void)state;
    write_yaml("run_name: \"a \\\"q\\\" \\\\ b\\n\\tc\\r\\x01 \\u00e9 \\x85 \\u2028 \\ufeff end\"\n"
               "lr: \" 0.5\"\namp: yes\nepochs: \"+7\"\nmodel: {hidden: [1, -2, 3]}\n");
    ddp_config *c, *c2;
    ddp_error err = {0};
    assert_int_equal(ddp_config_load(schema, N, path, 0, NULL, &c, &err), DDP_OK);
    const char *want = "a \"q\" \\ b\n\tc\r\x01 \xc3\xa9 \xc2\x85 \xe2\x80\xa8 \xef\xbb\xbf end";
    assert_string_equal(ddp_config_str(c, "run_name"), want);
    char *y = ddp_config_to_yaml(c);
    assert_non_null(y);
    assert_non_null(strstr(y, "lr: 0.5\n"));
    assert_non_null(strstr(y, "amp: true\n"));
    assert_non_null(strstr(y, "epochs: 7\n"));
    assert_non_null(strstr(y, "model.hidden: [1,-2,3]\n"));
    assert_non_null(strstr(y, "lr_scaling: \"none\"\n"));
    write_yaml(y);
    assert_int_equal(ddp_config_load(schema, N, path, 0, NULL, &c2, &err), DDP_OK);
    assert_string_equal(ddp_config_str(c2, "run_name"), want);
    assert_true(ddp_config_float(c2, "lr") == 0.5);
    assert_true(ddp_config_bool(c2, "amp"));
    assert_int_equal(ddp_config_int(c2, "epochs"), 7);
    size_t n;
    const int64_t *h = ddp_config_ints(c2, "model.hidden", &n);
    assert_int_equal(n, 3);
    assert_int_equal(h[1], -2);
    char *y2 = ddp_config_to_yaml(c2);
    assert_string_equal(y, y2);
    /* Floats keep every bit, in their shortest form. */
    char *argv[] = {"--lr", "0.1", "--model.dropout=0.30000000000000004"};
    ddp_config_free(c2);
    assert_int_equal(ddp_config_load(schema, N, NULL, 3, argv, &c2, &err), DDP_OK);
    free(y2);
    y2 = ddp_config_to_yaml(c2);
    assert_non_null(strstr(y2, "lr: 0.1\n"));
    assert_non_null(strstr(y2, "model.dropout: 0.30000000000000004\n"));
    free(y);
    free(y2);
    ddp_config_free(c);
    ddp_config_free(c2);
}

/* Maps nested thousands deep are refused with a message, not followed until the stack
 * overflows: a 10 KB file of 2600 levels crashed the loader (found by fuzzing the parser).
 * 5000 levels here: libyaml's scanner takes time quadratic in the depth (16000 levels, 3 s),
 * before the loader sees any of it. */
static void deep_nesting_refused(void **state)
{
    (void)state;
    const int depth = 5000;
    char *y = malloc((size_t)depth * 5 + 16);
    assert_non_null(y);
    size_t n = 0;
    for (int i = 0; i < depth; i++)
        memcpy(y + n, "{a: ", 4), n += 4;
    y[n++] = '1';
    memset(y + n, '}', (size_t)depth);
    n += (size_t)depth;
    y[n] = '\0';
    expect_fail(y, 0, NULL, "nested more than 64 deep", NULL);
    free(y);
    ddp_config *c = NULL;
    ddp_error err = {0};
    assert_int_equal(ddp_config_load(schema, N, path, 0, NULL, &c, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "line 1"));
    assert_null(c);
    /* Depth that a schema uses is fine. */
    write_yaml("model: {hidden: [4]}\n");
    assert_int_equal(ddp_config_load(schema, N, path, 0, NULL, &c, &err), DDP_OK);
    ddp_config_free(c);
}

/* Ten maps of ten aliases each (a file of 700 bytes) would be walked 10^9 times: the loader
 * stops after 100000 keys with a message (the loader hung on it; found while fuzzing). Aliases
 * that stay small still work. */
static void alias_bomb_refused(void **state)
{
    (void)state;
    char y[4096] = "l0: &l0 {}\n";
    for (int i = 1; i < 10; i++) {
        size_t n = strlen(y);
        n += (size_t)snprintf(y + n, sizeof y - n, "l%d: &l%d {", i, i);
        for (int j = 0; j < 10; j++)
            n += (size_t)snprintf(y + n, sizeof y - n, "%s%c: *l%d", j ? ", " : "", 'a' + j, i - 1);
        snprintf(y + n, sizeof y - n, "}\n");
    }
    expect_fail(y, 0, NULL, "more than 100000 keys", "aliases");

    write_yaml("defaults: &d {hidden: [7, 8]}\nmodel: *d\n");
    ddp_config *c = NULL;
    ddp_error err = {0};
    assert_int_equal(ddp_config_load(schema, N, path, 0, NULL, &c, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "defaults.hidden")); /* an unknown key, as without alias */
    write_yaml("lr: &x 0.25\nmodel: {dropout: *x}\n");
    assert_int_equal(ddp_config_load(schema, N, path, 0, NULL, &c, &err), DDP_OK);
    assert_true(ddp_config_float(c, "model.dropout") == 0.25);
    ddp_config_free(c);
}

/* Values of any length are read whole: a fixed 4 KB buffer cut longer strings and lists short
 * without a word (found by fuzz_config's round-trip check: crash-long-value). */
static void long_values_whole(void **state)
{
    (void)state;
    size_t n = 3000, cap = 16 * n + 64;
    char *y = malloc(cap), *want = malloc(n * 4);
    assert_non_null(y);
    assert_non_null(want);
    size_t k = (size_t)snprintf(y, cap, "run_name: \"");
    for (size_t i = 0; i < 3 * n; i++)
        want[i] = y[k++] = (char)('a' + i % 26);
    want[3 * n] = '\0';
    k += (size_t)snprintf(y + k, cap - k, "\"\nmodel:\n  hidden: [");
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(y + k, cap - k, "%s%zu", i ? ", " : "", i + 1);
    snprintf(y + k, cap - k, "]\n");
    write_yaml(y);
    ddp_config *c = NULL;
    ddp_error err = {0};
    assert_int_equal(ddp_config_load(schema, N, path, 0, NULL, &c, &err), DDP_OK);
    assert_string_equal(ddp_config_str(c, "run_name"), want);
    size_t m;
    const int64_t *h = ddp_config_ints(c, "model.hidden", &m);
    assert_int_equal(m, n);
    assert_int_equal(h[n - 1], (int64_t)n);
    ddp_config_free(c);
    free(want);
    free(y);

    /* A NUL inside a value cannot be kept in a C string: refused, not cut. */
    expect_fail("run_name: \"ab\\0cd\"\n", 0, NULL, "key 'run_name'", "NUL");
    /* Over 1 MiB, through aliases of a long string in a list: refused. */
    cap = 2 << 20;
    y = malloc(cap);
    assert_non_null(y);
    k = (size_t)snprintf(y, cap, "run_name: &s \"");
    for (int i = 0; i < 20000; i++)
        y[k++] = '7';
    k += (size_t)snprintf(y + k, cap - k, "\"\nmodel:\n  hidden: [*s");
    for (int i = 0; i < 60; i++)
        k += (size_t)snprintf(y + k, cap - k, ", *s");
    snprintf(y + k, cap - k, "]\n");
    expect_fail(y, 0, NULL, "longer than 1048576 bytes", NULL);
    free(y);
}

static void help_lists_every_key(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ddp_config_print_help(schema, N, f);
    fclose(f);
    for (size_t i = 0; i < N; i++)
        assert_non_null(strstr(buf, schema[i].name));
    assert_non_null(strstr(buf, "none|linear|sqrt"));
    free(buf);
    /* a schema that returns to top-level keys after a section: each heading once */
    static const ddp_cfg_key mixed[] = {
        {"lr", DDP_CFG_FLOAT, "0.1", NULL, "learning rate"},
        {"model.hidden", DDP_CFG_INT_LIST, "256", NULL, "layer sizes"},
        {"epochs", DDP_CFG_INT, "3", NULL, "epochs"},
        {"model.dropout", DDP_CFG_FLOAT, "0", NULL, "dropout"},
    };
    buf = NULL;
    f = open_memstream(&buf, &len);
    ddp_config_print_help(mixed, 4, f);
    fclose(f);
    const char *g = strstr(buf, "\ngeneral\n"), *m = strstr(buf, "\nmodel\n");
    assert_non_null(g);
    assert_non_null(m);
    assert_null(strstr(g + 1, "\ngeneral\n"));
    assert_null(strstr(m + 1, "\nmodel\n"));
    assert_true(strstr(buf, "--epochs") < m && strstr(buf, "--model.dropout") > m);
    free(buf);
    unlink(path);
}

/* The distance behind every "did you mean" (ddptrain's keys, ddprun's flags). */
static void edit_distance(void **state)
{
    (void)state;
    assert_int_equal(ddp_config_edit_distance("", ""), 0);
    assert_int_equal(ddp_config_edit_distance("lr", "lr"), 0);
    assert_int_equal(ddp_config_edit_distance("", "abc"), 3);
    assert_int_equal(ddp_config_edit_distance("kitten", "sitting"), 3);
    assert_int_equal(ddp_config_edit_distance("nprocs_per_node", "nproc_per_node"), 1);
    assert_int_equal(ddp_config_edit_distance("master_adress", "master_addr"), 4);
    char big[80];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(ddp_config_edit_distance(big, "a"), 99); /* too long to weigh */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_yaml_cli),
        cmocka_unit_test(errors),
        cmocka_unit_test(float_underflow_taken_overflow_refused),
        cmocka_unit_test(to_yaml_reads_back),
        cmocka_unit_test(deep_nesting_refused),
        cmocka_unit_test(alias_bomb_refused),
        cmocka_unit_test(long_values_whole),
        cmocka_unit_test(help_lists_every_key),
        cmocka_unit_test(edit_distance),
        cmocka_unit_test(key_and_section_share_a_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
