/*
 * test_config.c — the configuration: defaults, YAML (nested maps, lists), command-line
 * overrides in both spellings, precedence, and every error a user can make: unknown keys (with
 * a suggestion), bad values (naming the file and line), bad YAML (line and column).
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
    expect_fail("model:\n  hidden: [1, x]\n", 0, NULL, "is not a list of integers", NULL);
    ddp_config *c;
    ddp_error err = {0};
    assert_int_equal(ddp_config_load(schema, N, "/no/such.yaml", 0, NULL, &c, &err),
                     DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "cannot open config file '/no/such.yaml'"));
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
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_yaml_cli),
        cmocka_unit_test(errors),
        cmocka_unit_test(help_lists_every_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
