/*
 * test_gpu_module.c — libddp's loader of the GPU module (kernels/gpu.c, kernels/gpu_module.h),
 * on any machine: each case runs in a child process (the loader keeps its outcome for the
 * process's life) with DDP_GPU_MODULE pointing at a fake module (fake_gpu_module.c: a working
 * one, a stale ABI, a library without the entry symbol, one whose own dependency cannot be
 * found), a missing file or a file that is not a library, and checks the answer of
 * ddp__cuda_device_count and ddp_device_select, the one-line messages (the file named, dlerror's
 * words), and that nothing is mapped before the GPU is asked for (/proc/self/maps). With DDP_CUDA,
 * the real module is found in the build tree.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ddp/device.h"
#include "group/group_int.h"
#include "group/staged/staged_int.h"
#include "kernels/gpu_module.h"
#include "kernels/kernels.h"

/* Whether /proc/self/maps has a mapping whose path contains s. */
static bool mapped(const char *s)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, s) != NULL;
    fclose(f);
    return found;
}

/* Runs fn in a child with DDP_GPU_MODULE=module (unset when NULL); the child's failures (cmocka's
 * asserts print and exit nonzero there) fail the parent. */
static void in_child(const char *module, void (*fn)(const char *module))
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (module)
            setenv("DDP_GPU_MODULE", module, 1);
        else
            unsetenv("DDP_GPU_MODULE");
        fn(module);
        fflush(NULL);
        _exit(0);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
}

static void expect_fail(const char *module, const char *words)
{
    int n = -1;
    ddp_error err = {0};
    assert_int_equal(ddp__cuda_device_count(&n, &err), DDP_ERR_NOT_FOUND);
    assert_int_equal(n, -1);
    printf("  %s\n", err.msg);
    assert_non_null(strstr(err.msg, module));
    assert_non_null(strstr(err.msg, words));
    assert_null(strchr(err.msg, '\n'));
    assert_string_equal(ddp__gpu_module_path(), "");
    /* remembered: the second call says the same without trying again */
    ddp_error again = {0};
    assert_int_equal(ddp__cuda_device_count(&n, &again), DDP_ERR_NOT_FOUND);
    assert_string_equal(again.msg, err.msg);
    /* device cuda is an error naming the file; auto trains on the CPU and says why */
    ddp_device_choice c;
    assert_int_equal(ddp_device_select("cuda", 0, &c, &err), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "device 'cuda' asked for: cuda: "));
    assert_non_null(strstr(err.msg, module));
    assert_int_equal(ddp_device_select("auto", 0, &c, &err), DDP_OK);
    assert_int_equal(c.device, DDP_DEVICE_CPU);
    assert_int_equal(c.visible, 0);
    assert_non_null(strstr(c.note, "device auto: no usable GPU, training on the CPU (cuda: "));
    assert_non_null(strstr(c.note, module));
    /* the GPT's entry points answer the same, and freeing NULL is a no-op */
    ddp__cuda_gpt *g = NULL;
    ddp__cuda_gpt_cfg cfg = {0};
    assert_int_equal(ddp__cuda_gpt_create(&cfg, NULL, 0, &g, &err), DDP_ERR_NOT_FOUND);
    assert_null(g);
    ddp__cuda_gpt_free(NULL);
}

static void fake_works(const char *module)
{
    /* device cpu loads nothing */
    ddp_device_choice c;
    ddp_error err = {0};
    assert_int_equal(ddp_device_select("cpu", 0, &c, &err), DDP_OK);
    assert_int_equal(c.device, DDP_DEVICE_CPU);
    assert_false(mapped("fake_gpu_module"));
    assert_string_equal(ddp__gpu_module_path(), "");
    /* the first GPU question loads it, and the table answers */
    int n = 0;
    assert_int_equal(ddp__cuda_device_count(&n, &err), DDP_OK);
    assert_int_equal(n, 3);
    assert_true(mapped("fake_gpu_module"));
    assert_string_equal(ddp__gpu_module_path(), module);
    char name[64];
    assert_int_equal(ddp__cuda_device_name(1, name, sizeof name, &err), DDP_OK);
    assert_string_equal(name, "Fake GPU 1");
    assert_int_equal(ddp_device_select("auto", 5, &c, &err), DDP_OK);
    assert_int_equal(c.device, DDP_DEVICE_CUDA);
    assert_int_equal(c.cuda_index, 2); /* local rank 5 of 3 GPUs */
    assert_int_equal(c.visible, 3);
    assert_string_equal(c.name, "Fake GPU 2");
    /* forwarded to the module: its own message comes back */
    ddp__cuda_gpt *g = NULL;
    ddp__cuda_gpt_cfg cfg = {0};
    assert_int_equal(ddp__cuda_gpt_create(&cfg, NULL, 0, &g, &err), DDP_ERR_NOT_FOUND);
    assert_string_equal(err.msg, "fake gpu module: no GPT here");
    /* the GPU backends' device side too: cuda-staged's devops, nccl's create */
    ddp__devops d;
    err = (ddp_error){0};
    assert_int_equal(ddp__cuda_devops(0, &d, &err), DDP_ERR_NOT_FOUND);
    if (ddp__cuda_built)
        assert_string_equal(err.msg, "fake gpu module: no GPT here");
    ddp__setup s = {0};
    void *be = NULL;
    const ddp__backend_ops *ops = NULL;
    assert_int_equal(ddp__nccl_backend.create(&s, &be, &ops, &err), DDP_ERR_NOT_FOUND);
    if (ddp__nccl_built) /* this fake has no NCCL: the proxy says so, naming it */
        assert_non_null(strstr(err.msg, "was built without NCCL"));
    assert_null(be);
}

static void fake_module(void **state)
{
    (void)state;
    in_child(FAKE_MODULE, fake_works);
}

static void stale(const char *module)
{
    expect_fail(module, "has ABI 999");
    ddp_error err = {0};
    int n;
    (void)ddp__cuda_device_count(&n, &err);
    assert_non_null(strstr(err.msg, "stale module"));
    assert_false(mapped("stale_gpu_module")); /* refused and closed */
}

static void stale_module(void **state)
{
    (void)state;
    in_child(STALE_MODULE, stale);
}

static void no_entry(const char *module)
{
    expect_fail(module, "is not a ddpc GPU module");
    ddp_error err = {0};
    int n;
    (void)ddp__cuda_device_count(&n, &err);
    assert_non_null(strstr(err.msg, "ddp_gpu_module_entry")); /* dlerror names the symbol */
}

static void not_a_module(void **state)
{
    (void)state;
    in_child(NOENTRY_MODULE, no_entry);
}

static void missing(const char *module)
{
    expect_fail(module, "cannot load the GPU module");
    ddp_error err = {0};
    int n;
    (void)ddp__cuda_device_count(&n, &err);
    assert_non_null(strstr(err.msg, "No such file or directory")); /* dlerror's words */
}

static void missing_file(void **state)
{
    (void)state;
    in_child("/nonexistent/ddpc/libddp_gpu.so", missing);
}

static void needy(const char *module)
{
    expect_fail(module, "cannot load the GPU module");
    ddp_error err = {0};
    int n;
    (void)ddp__cuda_device_count(&n, &err);
    assert_non_null(strstr(err.msg, ": libfake_gpu_dep.so: cannot open shared object file"));
    assert_non_null(strstr(err.msg, "HINT: it needs the CUDA libraries it was built with"));
}

/* The module's own dependency is missing (libcublas.so.13 on a machine without it). */
static void missing_dependency(void **state)
{
    (void)state;
    in_child(NEEDY_MODULE, needy);
}

static void garbage(const char *module)
{
    expect_fail(module, "cannot load the GPU module");
}

static void not_a_library(void **state)
{
    (void)state;
    char path[] = "/tmp/ddpc-gpu-module-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not an ELF file\n", 16), 16);
    close(fd);
    in_child(path, garbage);
    unlink(path);
}

/* No override: the build's own module (found in the build tree's lib/), or the build says it
 * has no CUDA. */
static void default_search(const char *module)
{
    (void)module;
    assert_false(mapped("libddp_gpu"));
    assert_false(mapped("libcublas"));
    int n = 0;
    ddp_error err = {0};
    ddp_status st = ddp__cuda_device_count(&n, &err);
    printf("  device count: %s %s\n", st == DDP_OK ? "ok" : "not found:", err.msg);
#ifdef DDP_HAVE_GPU_MODULE
    /* loaded; with no GPU here the runtime's answer is NOT_FOUND, with one it counts them */
    assert_true(st == DDP_OK || st == DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(ddp__gpu_module_path(), "libddp_gpu.so"));
    assert_true(mapped("libddp_gpu.so"));
    if (st != DDP_OK)
        assert_non_null(strstr(err.msg, "cudaGetDeviceCount"));
#else
    assert_int_equal(st, DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "built without CUDA (DDP_CUDA=OFF)"));
    assert_string_equal(ddp__gpu_module_path(), "");
#endif
}

static void build_module(void **state)
{
    (void)state;
    in_child(NULL, default_search);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fake_module),   cmocka_unit_test(stale_module),
        cmocka_unit_test(not_a_module),  cmocka_unit_test(missing_file),
        cmocka_unit_test(not_a_library), cmocka_unit_test(missing_dependency),
        cmocka_unit_test(build_module),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
