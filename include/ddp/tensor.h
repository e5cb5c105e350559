/*
 * ddp/tensor.h — the vocabulary every other header speaks: element types, devices, reduction
 * operations and a plain view of a buffer. Nothing here allocates or owns memory.
 *
 * One ddp_dtype serves collectives, the reducer, checkpoints and the kernels; a checkpoint file
 * spells the same types in its own format ("F32", "BF16", …), and src/ckpt maps between the two.
 * The numeric values are stable (a checkpoint or a debug check may carry them between ranks).
 */
#ifndef DDP_TENSOR_H
#define DDP_TENSOR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddp_dtype {
    DDP_FLOAT32,  /* float */
    DDP_FLOAT64,  /* double */
    DDP_BFLOAT16, /* uint16_t storage, the high half of a float32; reduced in float32 and
                     rounded to nearest even */
    DDP_FLOAT16,  /* uint16_t storage, IEEE half; reduced in float32, rounded to nearest even */
    DDP_INT32,    /* int32_t; sums and products wrap */
    DDP_INT64,    /* int64_t; sums and products wrap */
    DDP_UINT8,    /* uint8_t; sums and products wrap */
    DDP_DTYPE_COUNT
} ddp_dtype;

/* Where a buffer's memory lives. CPU memory is anything the process can dereference. */
typedef enum ddp_device {
    DDP_DEVICE_CPU = 0,
    DDP_DEVICE_CUDA, /* memory of the calling thread's current CUDA device */
    DDP_DEVICE_COUNT
} ddp_device;

/* How elementwise reductions (collectives, the reducer) combine values. */
typedef enum ddp_op {
    DDP_SUM,
    DDP_AVG, /* sum / world size; integers divide with truncation toward zero */
    DDP_MIN,
    DDP_MAX,
    DDP_PROD,
    DDP_OP_COUNT
} ddp_op;

/* A view of count elements of dtype at ptr, on device. Plain data: it never owns the memory,
 * and a function that takes one borrows the memory for the call unless its comment says
 * otherwise. ptr may be NULL only when count is 0. A zero-initialised ddp_buf is an empty CPU
 * float32 view. */
typedef struct ddp_buf {
    void *ptr;
    size_t count; /* elements, not bytes */
    ddp_dtype dtype;
    ddp_device device;
} ddp_buf;

/* Bytes per element (0 for an invalid dtype). */
size_t ddp_dtype_size(ddp_dtype t);
/* Static names, never NULL: "float32" … "uint8" (torch's names), "cpu"/"cuda", "sum" … "prod";
 * "invalid dtype" / "invalid device" / "invalid op" for values out of range. */
const char *ddp_dtype_name(ddp_dtype t);
const char *ddp_device_name(ddp_device d);
const char *ddp_op_name(ddp_op op);

#ifdef __cplusplus
}
#endif
#endif /* DDP_TENSOR_H */
