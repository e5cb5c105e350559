/*
 * test_cuda.c — the CUDA side of src/kernels, through its C signatures (kernels/kernels.h).
 *
 * Exits with CTest's skip code (77) when there is no usable GPU — no driver, no device, or a
 * build without CUDA — printing why, so a machine without a GPU reports "skipped", not "passed";
 * with DDP_REQUIRE_GPU=1 that is a failure instead (gpu_skip.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "gpu_skip.h"
#include "kernels/kernels.h"

static void device_count(void **state)
{
    (void)state;
    int n = -1;
    ddp_error err = {0};
    assert_int_equal(ddp__cuda_device_count(&n, &err), DDP_OK);
    assert_true(n >= 1);
    assert_int_equal(ddp__cuda_device_count(NULL, &err), DDP_ERR_INVALID);
    assert_string_equal(err.msg, "cuda device count: the output n is NULL");
}

int main(void)
{
    int n = ddp_test_gpus_or_skip("test_cuda");
    printf("%d CUDA device(s)\n", n);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
