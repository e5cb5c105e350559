/*
 * test_device.c — choosing a rank's device and precision, and the GPU peak table
 * (include/ddp/device.h, src/kernels/device.c). Runs on any machine: the decision is tested with
 * made-up GPU counts through ddp__device_decide, and ddp_device_select against whatever this
 * machine has (on a machine without a GPU: `cuda` fails with the runtime's reason, `auto` falls
 * back to the CPU with a note).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ddp/device.h"
#include "kernels/cuda_kernels.h" /* its plain-C helpers: no CUDA needed */
#include "kernels/kernels.h"

static void precision_names(void **state)
{
    (void)state;
    const char *names[] = {"fp32", "tf32", "bf16", "fp16"};
    for (int p = 0; p < DDP_PRECISION_COUNT; p++) {
        ddp_precision got = DDP_PRECISION_COUNT;
        ddp_error err = {0};
        assert_string_equal(ddp_precision_name((ddp_precision)p), names[p]);
        assert_int_equal(ddp_precision_parse(names[p], &got, &err), DDP_OK);
        assert_int_equal(got, p);
    }
    assert_string_equal(ddp_precision_name(DDP_PRECISION_COUNT), "invalid precision");
    ddp_precision got = DDP_PRECISION_BF16;
    ddp_error err = {0};
    assert_int_equal(ddp_precision_parse("FP32", &got, &err), DDP_ERR_INVALID);
    assert_string_equal(err.msg, "precision 'FP32' is not one of fp32, tf32, bf16, fp16");
    assert_int_equal(got, DDP_PRECISION_BF16); /* untouched on failure */
    assert_int_equal(ddp_precision_parse(NULL, &got, &err), DDP_ERR_INVALID);
}

static void precision_on_cpu(void **state)
{
    (void)state;
    ddp_error err = {0};
    assert_int_equal(ddp_precision_check(DDP_DEVICE_CPU, DDP_PRECISION_FP32, &err), DDP_OK);
    for (int p = DDP_PRECISION_TF32; p < DDP_PRECISION_COUNT; p++) {
        assert_int_equal(ddp_precision_check(DDP_DEVICE_CUDA, (ddp_precision)p, &err), DDP_OK);
        if (p == DDP_PRECISION_BF16) { /* oneDNN's bf16 products where the CPU has the units */
            ddp_status st = ddp_precision_check(DDP_DEVICE_CPU, (ddp_precision)p, &err);
            assert_true(st == DDP_OK || st == DDP_ERR_NOT_FOUND);
            if (st != DDP_OK)
                assert_non_null(strstr(err.msg, "precision bf16 on the CPU needs"));
            continue;
        }
        assert_int_equal(ddp_precision_check(DDP_DEVICE_CPU, (ddp_precision)p, &err),
                         DDP_ERR_INVALID);
        assert_non_null(strstr(err.msg, "needs a GPU"));
        assert_non_null(strstr(err.msg, ddp_precision_name((ddp_precision)p)));
    }
}

static void placement(void **state)
{
    (void)state;
    /* LOCAL_RANK mod visible GPUs: 8 ranks on 8 GPUs each get their own; 4 ranks on 2 share
     * round-robin; none: −1. */
    for (int r = 0; r < 8; r++)
        assert_int_equal(ddp_device_cuda_index(r, 8), r);
    const int two[] = {0, 1, 0, 1, 0};
    for (int r = 0; r < 5; r++)
        assert_int_equal(ddp_device_cuda_index(r, 2), two[r]);
    assert_int_equal(ddp_device_cuda_index(3, 1), 0);
    assert_int_equal(ddp_device_cuda_index(0, 0), -1);
    assert_int_equal(ddp_device_cuda_index(-1, 4), -1);
}

static void decide(void **state)
{
    (void)state;
    ddp_device_choice c;
    ddp_error err = {0};
    /* cpu: always the CPU, whatever the GPUs. */
    assert_int_equal(ddp__device_decide("cpu", 3, 4, "", &c, &err), DDP_OK);
    assert_int_equal(c.device, DDP_DEVICE_CPU);
    assert_int_equal(c.cuda_index, -1);
    assert_string_equal(c.name, "cpu");
    assert_string_equal(c.note, "");
    /* cuda and auto with GPUs: LOCAL_RANK mod visible. */
    assert_int_equal(ddp__device_decide("cuda", 5, 4, "", &c, &err), DDP_OK);
    assert_int_equal(c.device, DDP_DEVICE_CUDA);
    assert_int_equal(c.cuda_index, 1);
    assert_int_equal(c.visible, 4);
    assert_string_equal(c.note, "");
    assert_int_equal(ddp__device_decide("auto", -1, 2, "", &c, &err), DDP_OK);
    assert_int_equal(c.device, DDP_DEVICE_CUDA);
    assert_int_equal(c.cuda_index, 0);
    /* none: cuda is an error carrying the reason; auto is the CPU with one line saying so. */
    memset(&c, 0x5a, sizeof c);
    ddp_device_choice before = c;
    assert_int_equal(ddp__device_decide("cuda", 0, 0, "no driver", &c, &err), DDP_ERR_NOT_FOUND);
    assert_string_equal(err.msg, "device 'cuda' asked for: no driver");
    assert_memory_equal(&c, &before, sizeof c); /* untouched on failure */
    assert_int_equal(ddp__device_decide("auto", 0, 0, "no driver", &c, &err), DDP_OK);
    assert_int_equal(c.device, DDP_DEVICE_CPU);
    assert_string_equal(c.note, "device auto: no usable GPU, training on the CPU (no driver)");
}

static void select_here(void **state)
{
    (void)state;
    ddp_device_choice c;
    ddp_error err = {0};
    assert_int_equal(ddp_device_select("gpu", 0, &c, &err), DDP_ERR_INVALID);
    assert_string_equal(err.msg, "device 'gpu' is not one of cpu, cuda, auto");
    assert_int_equal(ddp_device_select(NULL, 0, &c, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_device_select("cpu", 0, &c, &err), DDP_OK);
    assert_int_equal(c.device, DDP_DEVICE_CPU);
    int n = 0;
    ddp_error e2 = {0};
    size_t used = 0, total = 0;
    assert_int_equal(ddp_device_memory(0, NULL, &total, &err), DDP_ERR_INVALID);
    if (ddp__cuda_device_count(&n, &e2) == DDP_OK) { /* a GPU machine */
        assert_int_equal(ddp_device_select("cuda", 0, &c, &err), DDP_OK);
        assert_int_equal(c.device, DDP_DEVICE_CUDA);
        assert_int_equal(c.visible, n);
        assert_string_not_equal(c.name, "cpu");
        /* the memory in use (the contexts on a GPU; nothing yet on the emulated one), at most
         * the device's size */
        assert_int_equal(ddp_device_memory(0, &used, &total, &err), DDP_OK);
        printf("  cuda:0 memory: %zu of %zu MiB in use\n", used >> 20, total >> 20);
        assert_true(total > 0 && used <= total);
        assert_int_equal(ddp_device_memory(n, &used, &total, &err), DDP_ERR_INVALID);
        return;
    }
    /* no GPU: the memory query says why, as the device count does */
    assert_int_equal(ddp_device_memory(0, &used, &total, &err), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, e2.msg));
    assert_int_equal(ddp_device_select("cuda", 0, &c, &err), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "device 'cuda' asked for: "));
    assert_non_null(strstr(err.msg, e2.msg)); /* the runtime's (or the stub's) reason */
    assert_int_equal(ddp_device_select("auto", 1, &c, &err), DDP_OK);
    assert_int_equal(c.device, DDP_DEVICE_CPU);
    assert_int_equal(c.visible, 0);
    assert_non_null(strstr(c.note, "device auto: no usable GPU, training on the CPU ("));
}

static void peaks(void **state)
{
    (void)state;
    /* The drivers' names; dense datasheet figures. */
    assert_true(ddp_device_peak_flops("NVIDIA H100 80GB HBM3", DDP_PRECISION_BF16) == 989.4e12);
    assert_true(ddp_device_peak_flops("NVIDIA H100 80GB HBM3", DDP_PRECISION_TF32) == 494.7e12);
    assert_true(ddp_device_peak_flops("NVIDIA H100 80GB HBM3", DDP_PRECISION_FP16) == 989.4e12);
    assert_true(ddp_device_peak_flops("NVIDIA H100 80GB HBM3", DDP_PRECISION_FP32) == 67e12);
    assert_true(ddp_device_peak_flops("NVIDIA H100 PCIe", DDP_PRECISION_BF16) == 756.5e12);
    assert_true(ddp_device_peak_flops("NVIDIA H100 NVL", DDP_PRECISION_BF16) == 835.5e12);
    assert_true(ddp_device_peak_flops("NVIDIA H200", DDP_PRECISION_BF16) == 989.4e12);
    assert_true(ddp_device_peak_flops("NVIDIA H200 NVL", DDP_PRECISION_TF32) == 417.5e12);
    assert_true(ddp_device_peak_flops("NVIDIA GH200 480GB", DDP_PRECISION_BF16) == 989.4e12);
    assert_true(ddp_device_peak_flops("NVIDIA A100-SXM4-80GB", DDP_PRECISION_BF16) == 312e12);
    assert_true(ddp_device_peak_flops("NVIDIA A100 80GB PCIe", DDP_PRECISION_TF32) == 156e12);
    assert_true(ddp_device_peak_flops("NVIDIA L4", DDP_PRECISION_BF16) == 121e12);
    assert_true(ddp_device_peak_flops("NVIDIA L40S", DDP_PRECISION_BF16) == 362.05e12);
    assert_true(ddp_device_peak_flops("NVIDIA L40", DDP_PRECISION_BF16) == 181.05e12);
    assert_true(ddp_device_peak_flops("nvidia h100 pcie", DDP_PRECISION_TF32) == 378e12);
    assert_true(ddp_device_peak_flops("Tesla V100-SXM2-16GB", DDP_PRECISION_BF16) == 0);
    assert_true(ddp_device_peak_flops("Tesla V100-SXM2-16GB", DDP_PRECISION_FP16) == 125e12);
    assert_true(ddp_device_peak_flops("cpu", DDP_PRECISION_FP32) == 0);
    assert_true(ddp_device_peak_flops("Radeon", DDP_PRECISION_BF16) == 0);
    assert_true(ddp_device_peak_flops(NULL, DDP_PRECISION_BF16) == 0);
    assert_true(ddp_device_peak_flops("NVIDIA H100", DDP_PRECISION_COUNT) == 0);
}

/* What the GPU code derives from addresses and sizes, checked where there is no GPU: the
 * alignment cuBLASLt is told (its heuristic assumes 256 bytes otherwise: views into the GPT's
 * flat parameters are often 16- or 4-byte aligned), when the bias epilogue may be used, and the
 * CUDA GPT's per-tensor padding on the device. */
static void cuda_alignment(void **state)
{
    (void)state;
    static _Alignas(256) float buf[1024];
    assert_int_equal(ddp__cuda_align_of(buf), 256);
    assert_int_equal(ddp__cuda_align_of(buf + 64), 256);
    assert_int_equal(ddp__cuda_align_of(buf + 32), 128);
    assert_int_equal(ddp__cuda_align_of(buf + 4), 16);
    assert_int_equal(ddp__cuda_align_of(buf + 2), 8);
    assert_int_equal(ddp__cuda_align_of(buf + 1), 4);
    assert_int_equal(ddp__cuda_align_of((const char *)buf + 2), 2); /* a bf16 element */
    assert_int_equal(ddp__cuda_align_of((const char *)buf + 1), 1);
    assert_int_equal(ddp__cuda_align_of(NULL), 256);
    /* the GPT's tensors at their CPU-layout offsets are not 256-byte aligned in general:
     * wpe after wte of vocab 97 × n_embd 48 (test_gpt_torch's second case) is 64-byte aligned */
    assert_int_equal(ddp__cuda_align_of(buf + 97 * 48 % 1024), 64);
    assert_true(ddp__cuda_bias_epilogue_ok(buf + 4));
    assert_true(ddp__cuda_bias_epilogue_ok(buf + 68));
    assert_false(ddp__cuda_bias_epilogue_ok(buf + 1));
    assert_false(ddp__cuda_bias_epilogue_ok(buf + 2));
    assert_false(ddp__cuda_bias_epilogue_ok(buf + 6));
    /* device padding: whole 256-byte blocks, nothing added to a multiple of 64 floats */
    assert_int_equal(ddp__cuda_param_span(0), 0);
    assert_int_equal(ddp__cuda_param_span(1), 64);
    assert_int_equal(ddp__cuda_param_span(64), 64);
    assert_int_equal(ddp__cuda_param_span(65), 128);
    assert_int_equal(ddp__cuda_param_span(97 * 48), 4672);
    assert_int_equal(ddp__cuda_param_span((size_t)50257 * 768), (size_t)50257 * 768);
    /* offsets built from spans are all 256-byte aligned, whatever the counts */
    const size_t counts[] = {97 * 48, 16 * 48, 48, 3 * 48 * 48, 3 * 48, 7, 1, 50257};
    size_t off = 0;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        assert_int_equal(off % 64, 0);
        assert_true(ddp__cuda_param_span(counts[i]) >= counts[i]);
        assert_true(ddp__cuda_param_span(counts[i]) < counts[i] + 64);
        off += ddp__cuda_param_span(counts[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(precision_names), cmocka_unit_test(precision_on_cpu),
        cmocka_unit_test(placement),       cmocka_unit_test(decide),
        cmocka_unit_test(select_here),     cmocka_unit_test(peaks),
        cmocka_unit_test(cuda_alignment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
