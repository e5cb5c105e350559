/*
 * kernels/device.c — choosing a rank's device and precision (include/ddp/device.h), and the
 * table of GPU peaks for MFU. Plain C: what it needs from the CUDA runtime it asks through
 * kernels.h's ddp__cuda_* signatures (kernels/gpu.c: the GPU module, loaded on first use). The
 * decision itself (device_decide) takes the GPU count as an argument, so every branch is
 * testable on a machine without a GPU (tests/unit/test_device.c).
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "ddp/device.h"
#include "kernels/kernels.h"
#include "util/util.h"

static const char *const precision_names[DDP_PRECISION_COUNT] = {
    [DDP_PRECISION_FP32] = "fp32",
    [DDP_PRECISION_TF32] = "tf32",
    [DDP_PRECISION_BF16] = "bf16",
    [DDP_PRECISION_FP16] = "fp16",
};

const char *ddp_precision_name(ddp_precision p)
{
    return (unsigned)p < DDP_PRECISION_COUNT ? precision_names[p] : "invalid precision";
}

ddp_status ddp_precision_parse(const char *s, ddp_precision *out, ddp_error *err)
{
    for (int p = 0; s && p < DDP_PRECISION_COUNT; p++)
        if (!strcmp(s, precision_names[p])) {
            *out = (ddp_precision)p;
            return DDP_OK;
        }
    return ddp__err(err, DDP_ERR_INVALID, "precision '%s' is not one of fp32, tf32, bf16, fp16",
                    s ? s : "(null)");
}

ddp_status ddp_precision_check(ddp_device d, ddp_precision p, ddp_error *err)
{
    if ((unsigned)p >= DDP_PRECISION_COUNT || (unsigned)d >= DDP_DEVICE_COUNT)
        return ddp__err(err, DDP_ERR_INVALID, "precision %d on device %d: out of range", (int)p,
                        (int)d);
    if (p == DDP_PRECISION_FP32 || d == DDP_DEVICE_CUDA)
        return DDP_OK;
    if (p == DDP_PRECISION_BF16) /* oneDNN's bf16 products, where the CPU has bf16 units */
        return ddp__gemm_bf16_check(err);
    return ddp__err(err, DDP_ERR_INVALID,
                    "precision '%s' needs a GPU: the CPU path computes in fp32 or bf16; HINT: set "
                    "precision fp32 (or bf16), or device cuda on a machine with an NVIDIA GPU",
                    ddp_precision_name(p));
}

void ddp_bf16_cpu_counts(uint64_t *products, uint64_t *fallbacks)
{
    /* fallbacks first: each was counted after its product, so products ≥ fallbacks */
    uint64_t f = ddp__gemm_bf16_fallbacks();
    *products = ddp__gemm_bf16_products();
    *fallbacks = f;
}

int ddp_device_cuda_index(int local_rank, int visible)
{
    if (visible < 1 || local_rank < 0)
        return -1;
    return local_rank % visible;
}

ddp_status ddp__device_decide(const char *want, int local_rank, int visible, const char *why,
                              ddp_device_choice *out, ddp_error *err)
{
    ddp_device_choice c;
    memset(&c, 0, sizeof c);
    c.cuda_index = -1;
    c.visible = visible;
    snprintf(c.name, sizeof c.name, "cpu");
    if (local_rank < 0)
        local_rank = 0;
    if (!strcmp(want, "cpu")) {
        *out = c;
        return DDP_OK;
    }
    if (visible >= 1) {
        c.device = DDP_DEVICE_CUDA;
        c.cuda_index = ddp_device_cuda_index(local_rank, visible);
        ddp_error e2 = {0};
        if (ddp__cuda_device_name(c.cuda_index, c.name, sizeof c.name, &e2) != DDP_OK)
            snprintf(c.name, sizeof c.name, "cuda:%d", c.cuda_index);
        *out = c;
        return DDP_OK;
    }
    if (!strcmp(want, "cuda"))
        return ddp__err(err, DDP_ERR_NOT_FOUND, "device 'cuda' asked for: %s", why);
    snprintf(c.note, sizeof c.note, "device auto: no usable GPU, training on the CPU (%s)", why);
    *out = c;
    return DDP_OK;
}

ddp_status ddp_device_select(const char *want, int local_rank, ddp_device_choice *out,
                             ddp_error *err)
{
    if (!want || (strcmp(want, "cpu") && strcmp(want, "cuda") && strcmp(want, "auto")))
        return ddp__err(err, DDP_ERR_INVALID, "device '%s' is not one of cpu, cuda, auto",
                        want ? want : "(null)");
    if (!out)
        return ddp__err(err, DDP_ERR_INVALID, "device select: the output is NULL");
    int visible = 0;
    ddp_error why = {0};
    if (strcmp(want, "cpu") != 0) {
        ddp_status st = ddp__cuda_device_count(&visible, &why);
        if (st == DDP_ERR_SYSTEM && !strcmp(want, "cuda"))
            return ddp__err(err, st, "device 'cuda': %s", why.msg);
        if (st != DDP_OK)
            visible = 0;
    }
    return ddp__device_decide(want, local_rank, visible, why.msg, out, err);
}

/* ---- peaks ----------------------------------------------------------------------------------
 * Dense tensor-core peaks (half the "with sparsity" datasheet figures) at boost clock, TFLOP/s:
 * fp32 is the plain (non-tensor) fp32 peak. Patterns are tried in order, so the more specific
 * come first ("H100 PCIe" before "H100", "A100" before anything shorter, "L40S" before "L4"). */
static const struct peak {
    const char *pattern;
    double fp32, tf32, bf16, fp16;
} peaks[] = {
    {"GH200", 67.0, 494.7, 989.4, 989.4},     /* Grace Hopper: the H100 SXM's GPU */
    {"H100 PCIe", 51.2, 378.0, 756.5, 756.5}, /* "NVIDIA H100 PCIe" */
    {"H100 NVL", 60.0, 417.5, 835.5, 835.5},  /* "NVIDIA H100 NVL" */
    {"H200 NVL", 60.0, 417.5, 835.5, 835.5},  /* "NVIDIA H200 NVL" */
    {"H100", 67.0, 494.7, 989.4, 989.4},      /* SXM5: "NVIDIA H100 80GB HBM3" */
    {"H200", 67.0, 494.7, 989.4, 989.4},      /* SXM: "NVIDIA H200" */
    {"A100", 19.5, 156.0, 312.0, 312.0},      /* SXM4 and PCIe alike */
    {"L40S", 91.6, 183.0, 362.05, 362.05},    /* "NVIDIA L40S" */
    {"L40", 90.5, 90.5, 181.05, 181.05},      /* "NVIDIA L40" */
    {"L4", 30.3, 60.0, 121.0, 121.0},         /* "NVIDIA L4" */
    {"RTX 4090", 82.6, 82.6, 165.2, 165.2},   /* fp16/bf16 with fp32 accumulation */
    {"V100", 15.7, 0.0, 0.0, 125.0},          /* SXM2; no tf32 or bf16 units */
};

/* Whether pattern occurs in s, ignoring case. */
static bool contains_nocase(const char *s, const char *pattern)
{
    size_t n = strlen(pattern);
    for (; *s; s++)
        if (!strncasecmp(s, pattern, n))
            return true;
    return false;
}

ddp_status ddp_device_memory(int cuda_index, size_t *used, size_t *total, ddp_error *err)
{
    return ddp__cuda_mem_info(cuda_index, used, total, err);
}

double ddp_device_peak_flops(const char *name, ddp_precision p)
{
    if (!name || (unsigned)p >= DDP_PRECISION_COUNT)
        return 0;
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++) {
        if (!contains_nocase(name, peaks[i].pattern))
            continue;
        const struct peak *e = &peaks[i];
        double tf = p == DDP_PRECISION_FP32   ? e->fp32
                    : p == DDP_PRECISION_TF32 ? e->tf32
                    : p == DDP_PRECISION_BF16 ? e->bf16
                                              : e->fp16;
        return tf * 1e12;
    }
    return 0;
}
