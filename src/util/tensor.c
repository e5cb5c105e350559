/*
 * tensor.c — the names and sizes of the shared vocabulary in include/ddp/tensor.h. At the bottom
 * of the tree so that every module (group, ckpt, kernels, nn) can use it; it knows nothing about
 * any file format or backend.
 */
#include "ddp/tensor.h"

size_t ddp_dtype_size(ddp_dtype t)
{
    static const size_t sizes[DDP_DTYPE_COUNT] = {
        [DDP_FLOAT32] = 4, [DDP_FLOAT64] = 8, [DDP_BFLOAT16] = 2, [DDP_FLOAT16] = 2,
        [DDP_INT32] = 4,   [DDP_INT64] = 8,   [DDP_UINT8] = 1,
    };
    return (unsigned)t < DDP_DTYPE_COUNT ? sizes[t] : 0;
}

const char *ddp_dtype_name(ddp_dtype t)
{
    static const char *const names[DDP_DTYPE_COUNT] = {
        [DDP_FLOAT32] = "float32", [DDP_FLOAT64] = "float64", [DDP_BFLOAT16] = "bfloat16",
        [DDP_FLOAT16] = "float16", [DDP_INT32] = "int32",     [DDP_INT64] = "int64",
        [DDP_UINT8] = "uint8",
    };
    return (unsigned)t < DDP_DTYPE_COUNT ? names[t] : "invalid dtype";
}

const char *ddp_device_name(ddp_device d)
{
    static const char *const names[DDP_DEVICE_COUNT] = {
        [DDP_DEVICE_CPU] = "cpu", [DDP_DEVICE_CUDA] = "cuda"};
    return (unsigned)d < DDP_DEVICE_COUNT ? names[d] : "invalid device";
}

const char *ddp_op_name(ddp_op op)
{
    static const char *const names[DDP_OP_COUNT] = {
        [DDP_SUM] = "sum", [DDP_AVG] = "avg",   [DDP_MIN] = "min",
        [DDP_MAX] = "max", [DDP_PROD] = "prod",
    };
    return (unsigned)op < DDP_OP_COUNT ? names[op] : "invalid op";
}
