/*
 * ddp/device.h — where a rank computes and in what precision: choosing the device from a
 * setting ("cpu", "cuda", "auto") and the rank's LOCAL_RANK, the precision names, and the
 * dense peak FLOP/s of known GPUs for MFU.
 *
 *   ddp_device_choice dc;
 *   if (ddp_device_select("auto", world.local_rank, &dc, &err) != DDP_OK) … err.msg
 *   if (dc.note[0]) puts(dc.note);                 // "device auto: no usable GPU …; using the CPU"
 *   ddp_precision p;
 *   ddp_precision_parse("bf16", &p, &err);
 *   ddp_precision_check(dc.device, p, &err);        // fp16 on the CPU: an error, not a surprise
 *   double peak = ddp_device_peak_flops(dc.name, p); // 0 when the name is not in the table
 *
 * Placement: rank r of a host uses GPU (LOCAL_RANK mod visible GPUs), so every rank of a host
 * gets its own GPU when there are enough, and ranks share GPUs round-robin when there are not
 * (the shared-GPU backend's case). Never "every rank on GPU 0".
 *
 * Nothing here creates a CUDA context beyond what the runtime's device query does; the model
 * (ddp/model.h, spec.device) sets the device it runs on. Thread-safe.
 */
#ifndef DDP_DEVICE_H
#define DDP_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "ddp/status.h"
#include "ddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The arithmetic of a model's matrix work. Stable values (stored in configurations by name). */
typedef enum ddp_precision {
    DDP_PRECISION_FP32 = 0, /* fp32 tensors, exact fp32 GEMMs (the reference) */
    DDP_PRECISION_TF32,     /* fp32 tensors, TF32 tensor-core GEMMs (10-bit mantissa inputs) */
    DDP_PRECISION_BF16,     /* bf16 activations and GEMM inputs, fp32 accumulation, fp32 master
                               weights and optimizer state */
    DDP_PRECISION_FP16,     /* as bf16 in IEEE half, plus dynamic loss scaling (ddp/amp.h) */
    DDP_PRECISION_COUNT
} ddp_precision;

/* "fp32", "tf32", "bf16", "fp16"; "invalid precision" out of range. Static, never NULL. */
const char *ddp_precision_name(ddp_precision p);
/* The precision spelled s (one of the names above); *out written only on DDP_OK.
 * DDP_ERR_INVALID with a message listing the choices otherwise. */
ddp_status ddp_precision_parse(const char *s, ddp_precision *out, ddp_error *err);

/* DDP_OK when device d can compute in precision p: fp32 anywhere; tf32, bf16 and fp16 on CUDA;
 * bf16 on the CPU too where oneDNN (libdnnl2) loads and the CPU has bf16 matrix units
 * (AVX512_BF16 or AMX) — the matrix products then take bf16 operands with float32 accumulation,
 * everything else stays float32 (docs/nn.md). DDP_ERR_INVALID (DDP_ERR_NOT_FOUND for bf16 on a
 * CPU that cannot) with a message saying what to set instead. The first bf16 check on the CPU
 * loads oneDNN. */
ddp_status ddp_precision_check(ddp_device d, ddp_precision p, ddp_error *err);

/* The bf16 matrix products this process has computed on the CPU (precision bf16) since it
 * started: *products how many asked for bf16, *fallbacks how many of those oneDNN could not
 * compute (out of memory, a oneDNN error) and that were computed in float32 instead — right,
 * but slower and more exact than asked. 0 in a healthy run; a program reports a nonzero count
 * (ddptrain does, at the end of a run). Products of size 0 are not counted. Any thread. */
void ddp_bf16_cpu_counts(uint64_t *products, uint64_t *fallbacks);

/* The GPU a rank with this LOCAL_RANK uses among `visible` GPUs: local_rank mod visible. −1
 * when visible < 1 or local_rank < 0. Pure. */
int ddp_device_cuda_index(int local_rank, int visible);

/* What ddp_device_select decided. Plain data. */
typedef struct ddp_device_choice {
    ddp_device device; /* DDP_DEVICE_CPU or DDP_DEVICE_CUDA */
    int cuda_index;    /* the GPU's index among the visible ones; −1 on the CPU */
    int visible;       /* GPUs this process can see (0 when none or no driver) */
    char name[128];    /* the GPU's name as the driver gives it ("NVIDIA H100 80GB HBM3"), or
                          "cpu" */
    char note[512];    /* one line to print when `auto` fell back to the CPU, else "" */
} ddp_device_choice;

/* Chooses the device for setting `want`: "cpu" (always the CPU), "cuda" (GPU
 * ddp_device_cuda_index(local_rank, visible); DDP_ERR_NOT_FOUND with the runtime's reason when
 * there is none, or in a build without CUDA), "auto" (the GPU if there is one, else the CPU with
 * out->note saying why). local_rank < 0 is taken as 0 (a world of one). *out written only on
 * DDP_OK; DDP_ERR_INVALID for any other `want`. Does not set the calling thread's device. */
ddp_status ddp_device_select(const char *want, int local_rank, ddp_device_choice *out,
                             ddp_error *err);

/* The dense (no sparsity) peak FLOP/s of the GPU named `name` (a driver name such as
 * "NVIDIA H100 80GB HBM3"; matched case-insensitively by the table's patterns, most specific
 * first) for matrix work in precision p: bf16/fp16 tensor-core peaks with fp32 accumulation,
 * tf32 tensor-core peaks, and for fp32 the plain fp32 (non-tensor) peak. 0 when the name is not
 * in the table, or the device has no such unit (V100: no bf16). Figures are the vendors'
 * datasheet numbers at boost clocks (docs/gpu.md lists them). Pure. */
double ddp_device_peak_flops(const char *name, ddp_precision p);

/* GPU cuda_index's memory (an index as ddp_device_choice's): *used = bytes in use by every
 * process on it (total − free: what nvidia-smi shows, the CUDA contexts, libraries' workspaces
 * and NCCL's buffers included; with several ranks on one GPU, all of theirs), *total = its size.
 * DDP_ERR_NOT_FOUND without a GPU (or in a build without CUDA), DDP_ERR_INVALID for a bad index
 * or NULL outputs, DDP_ERR_SYSTEM for another CUDA error; message in err. Any thread. */
ddp_status ddp_device_memory(int cuda_index, size_t *used, size_t *total, ddp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DDP_DEVICE_H */
