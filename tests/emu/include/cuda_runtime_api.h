/*
 * tests/emu/include/cuda_runtime_api.h — the CUDA runtime of the emulated GPU module
 * (tests/emu/CMakeLists.txt builds libddp_gpu_emu.so from src/kernels/cuda for the CPU; the
 * implementation is tests/emu/gpu_rt_emu.cpp). C-compatible, as the real header (cudaops.c is C);
 * in C++ it also brings cuda_emu.h (threads, blocks, shared memory) and emu_rt_launch, which the
 * rewritten `k<<<grid, block, smem, stream>>>(args)` launches call (cu_module.py).
 * Only what the module uses, with the real names, values and signatures.
 */
#ifndef DDP_EMU_CUDA_RUNTIME_API_H
#define DDP_EMU_CUDA_RUNTIME_API_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorDevicesUnavailable = 46,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorDeviceUninitialized = 201,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostAllocDefault 0x00
#define cudaIpcMemLazyEnablePeerAccess 0x01

typedef struct cudaIpcMemHandle_st {
    char reserved[64];
} cudaIpcMemHandle_t;

typedef struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    int multiProcessorCount;
    size_t sharedMemPerBlockOptin;
    size_t sharedMemPerMultiprocessor;
    int maxThreadsPerMultiProcessor;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int l2CacheSize;
} cudaDeviceProp;

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s);
cudaError_t cudaMemset(void *dst, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void *p);
cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute attr, int value);

/* The emulation's own: whether [p, p + bytes) lies in one cudaMalloc'd block (1) or not (0). */
int emu_rt_is_device(const void *p, size_t bytes);
/* The emulation's own: runs the work queued on stream s (NULL: on the blocking streams) now:
 * what a library that computes at the call (the emulated cuDNN) does first. */
void emu_rt_stream_flush(cudaStream_t s);
/* The emulation's own, for a library that computes at the call (the emulated cuDNN): its work
 * begins (1) or ends (0), inside which a dry run's device memory is accessible (gpu_rt_emu.cpp);
 * nested calls nest. A no-op outside a dry run. */
void emu_rt_device_work(int begin);

#ifdef __cplusplus
}
#include "cuda_emu.h"
#include <functional>
#include <type_traits>
/* A launch as the hardware takes it: the geometry and dynamic shared memory checked (an error
 * for cudaGetLastError, nothing run) or the kernel queued on its stream and run in its turn
 * (gpu_rt_emu.cpp: when something waits for it) on an emulated block. Dynamic shared memory
 * over 48 KiB needs a cudaFuncSetAttribute(MaxDynamicSharedMemorySize) first, on any kernel (the
 * emulation cannot name a template kernel whose arguments are deduced: the largest value set
 * counts). */
cudaError_t emu_rt_launch_check(const char *name, dim3 grid, dim3 block, size_t smem,
                                cudaStream_t s);
/* Queues f on stream s (NULL: the legacy stream; gpu_rt_emu.cpp: it runs when something waits
 * for it, after what s must wait for), or runs it now (DDP_EMU_STREAMS=immediate). */
void emu_rt_enqueue(cudaStream_t s, std::function<void()> f);
/* Queues f, work that may not be ready yet (false: it stays first in the queue and runs again at
 * the next wait, as a kernel that spins; cudaEventQuery says cudaErrorNotReady meanwhile), on s:
 * the emulated NCCL's collectives (nccl_emu.cpp). */
void emu_rt_enqueue_poll(cudaStream_t s, std::function<bool()> f);
/* Whether the runtime does a dry run (DDP_EMU_DRYRUN=1, gpu_rt_emu.cpp): every call checked,
 * copies, memsets and cuBLAS products not done, of each kernel only the first and last block. */
bool emu_rt_dry(void);
/* A launch: checked now (a refused one leaves its error for cudaGetLastError), run in its
 * stream's turn; f holds copies of the arguments (cu_module.py's [=]). */
template <typename F>
inline void emu_rt_launch(const char *name, F &&f, dim3 grid, dim3 block, size_t smem = 0,
                          cudaStream_t s = 0)
{
    if (emu_rt_launch_check(name, grid, block, smem, s) == cudaSuccess)
        emu_rt_enqueue(s, [grid, block, smem, k = std::decay_t<F>(f)] {
            emu_launch_fibers(grid, block, smem, k, emu_rt_dry());
        });
}
/* A kernel's __launch_bounds__(max_threads), checked at its entry (cu_module.py puts the call
 * there): a launch of more threads per block is one the hardware refuses. */
inline void emu_launch_bounds(unsigned max_threads, const char *kernel)
{
    if (blockDim.x * blockDim.y * blockDim.z > max_threads) {
        fprintf(stderr, "gpu emulation: %s launched with %u threads per block, over its "
                        "__launch_bounds__(%u): the hardware refuses the launch\n",
                kernel, blockDim.x * blockDim.y * blockDim.z, max_threads);
        abort();
    }
}
template <typename T>
inline cudaError_t cudaFuncSetAttribute(T *fn, enum cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute((const void *)fn, attr, value);
}
#endif
#endif
