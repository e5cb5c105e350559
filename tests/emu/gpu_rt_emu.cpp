/*
 * tests/emu/gpu_rt_emu.cpp — the CUDA runtime, cuBLAS and cuBLASLt under the emulated GPU module
 * (tests/emu/CMakeLists.txt; headers in tests/emu/include). One emulated H100-like device
 * (DDP_EMU_GPUS of them), all on the CPU:
 *  - device memory is host memory (posix_memalign, 256-byte aligned as cudaMalloc's, filled
 *    with 0xff bytes: NaN in every float format, so a read of what was never written shows);
 *    ASan builds see kernels' and copies' out-of-bounds accesses; every build checks each copy,
 *    memset and cuBLAS operand against the cudaMalloc'd block it must lie in, and aborts naming
 *    the call when it does not (cudaFree of a pointer cudaMalloc never returned too).
 *  - streams run their work LATE, as a GPU may: a launch, an async copy or memset, a cuBLAS
 *    product is queued on its stream and runs (on whichever host thread asks, in issue order)
 *    only when something waits for it: cudaEventQuery/Synchronize of an event recorded after
 *    it, cudaStreamSynchronize, a stream that cudaStreamWaitEvent'ed on such an event running,
 *    cudaDeviceSynchronize, cudaFree (which synchronizes the device), or a copy from pageable
 *    memory on the same stream (the runtime syncs the stream for those). The legacy stream
 *    (NULL: launches on stream 0, cudaMemset, cudaMemcpy between device buffers) is a queue
 *    too: its work runs late, after the earlier work of every blocking stream, and a blocking
 *    stream's work runs after the legacy stream's earlier work; a stream created
 *    cudaStreamNonBlocking is ordered against it only by events — as on a GPU. cudaMemcpy with
 *    a host side returns when its copy is done (so the legacy stream's earlier work has run).
 *    So work on one stream that reads what another stream (the legacy one included) wrote
 *    without an event between them reads what was there before (0xff bytes: NaN, if never
 *    written) and the tests' comparisons fail. Copies between pinned host memory
 *    (cudaMallocHost, cudaHostRegister) and the device stay queued too, so a host buffer reused
 *    before its copy ran shows. DDP_EMU_STREAMS=immediate runs everything at once instead.
 *    Work may be not ready (emu_rt_enqueue_poll: an emulated NCCL collective waiting for a peer,
 *    nccl_emu.cpp; queued even when immediate): it stays first in its queue, cudaEventQuery
 *    says cudaErrorNotReady, the next wait tries it again, as a kernel that spins; blocking
 *    waits retry with run_m released between tries.
 *  - the devices' PCI bus ids are 0x10 + the physical number; DDP_EMU_VISIBLE_DEVICES (a list,
 *    as CUDA_VISIBLE_DEVICES) maps visible numbers to physical ones.
 *  - launches are validated as the hardware does (≤ 1024 threads, block ≤ 1024×1024×64, grid
 *    x < 2³¹ and y, z ≤ 65535, dynamic shared memory ≤ 48 KiB unless raised with
 *    cudaFuncSetAttribute, ≤ 227 KiB): a bad one runs nothing and leaves its error for
 *    cudaGetLastError (per thread, as CUDA's).
 *  - cuBLAS/cuBLASLt products are plain loops accumulated in double and rounded once to the
 *    output's type (TF32 inputs rounded to 10 mantissa bits first); argument errors real cuBLAS
 *    rejects (ld < rows, mismatched shapes, operands outside their buffers, a heuristic's
 *    alignment promise the pointers break) abort with a message: they are the module's bugs.
 *    Refused (NOT_SUPPORTED from the heuristic): an epilogue other than those listed in
 *    cublasLt.h, a bias whose type is not D's (the stricter reading of cublasLt.h, so the
 *    module's fallback runs), TF32 compute with 16-bit inputs; INVALID_VALUE: a GELU aux
 *    leading dimension not a multiple of 8 or an aux pointer not 16-byte aligned.
 *  - IPC: a cudaMalloc'd block of 64 KiB or more is a memfd mapping; its handle names this
 *    process and the descriptor, and cudaIpcOpenMemHandle in another process maps it through
 *    /proc/<pid>/fd (the tests' processes run as one user). As CUDA's: a handle names a whole
 *    allocation (exporting a pointer inside one aborts here: the peer would get the block's
 *    start), a process cannot open its own handle (cudaErrorDeviceUninitialized), an opened
 *    block is released by cudaIpcCloseMemHandle, not cudaFree (which aborts). Smaller blocks:
 *    cudaErrorNotSupported. Host registration: recorded, nothing else.
 *  - DDP_EMU_DRYRUN=1, a dry run at full size (tests/emu/scale_gpt.c: GPT-2 124M at batch 64)
 *    and a host-access check (test_gpu_emu_dry.sh): device memory is reserved, not committed
 *    (MAP_NORESERVE, never filled, 16 GiB that fault on access either side of each block, where
 *    a wrapped 32-bit index lands) and accessible only while queued device work runs, so a host
 *    access to it faults, as on a GPU. Every launch, copy, memset and cuBLAS call is checked as
 *    above; copies and memsets over 1 MiB and products are not done (a host destination of a
 *    copy gets zeros), smaller ones and the emulated NCCL's collectives are, and of each kernel
 * only the first and the last block of its grid run: launch limits, operands' bounds and kernels'
 *    largest indices at sizes no test could compute, in a few pages. No IPC in a dry run.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdarg>
#include <deque>
#include <dlfcn.h>
#include <fcntl.h>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#define EMU_API extern "C" __attribute__((visibility("default")))

[[noreturn]] static void emu_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emu_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gpu emulation: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

/* classifier.cu dlopens cuDNN (DDP_CUDNN_LIB, else libcudnn.so.9): unless told otherwise, the
 * emulated module's is the emulated cuDNN beside it (cudnn_emu.cpp), never a real one, which would
 * call a real CUDA runtime. */
__attribute__((constructor)) static void emu_cudnn_default(void)
{
    const char *v = getenv("DDP_CUDNN_LIB");
    Dl_info info;
    if ((v && *v) || !dladdr((void *)&emu_cudnn_default, &info) || !info.dli_fname)
        return;
    const char *slash = strrchr(info.dli_fname, '/');
    char path[4096];
    snprintf(path, sizeof path, "%.*slibcudnn_emu.so",
             slash ? (int)(slash - info.dli_fname + 1) : 0, info.dli_fname);
    setenv("DDP_CUDNN_LIB", path, 0);
}

/* ---- errors */
static thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t set_err(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}
struct err_name {
    cudaError_t e;
    const char *name, *str;
};
static const err_name errs[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
EMU_API const char *cudaGetErrorString(cudaError_t e)
{
    for (auto &x : errs)
        if (x.e == e)
            return x.str;
    return "unrecognized error code";
}
EMU_API const char *cudaGetErrorName(cudaError_t e)
{
    for (auto &x : errs)
        if (x.e == e)
            return x.name;
    return "cudaErrorUnknown";
}
EMU_API cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
EMU_API cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

/* ---- devices */
static int n_devices()
{
    const char *v = getenv("DDP_EMU_GPUS");
    int n = v ? atoi(v) : 1;
    return n < 0 ? 0 : n > 16 ? 16 : n;
}
static thread_local int cur_device = 0;
/* The physical device behind visible device `dev`: DDP_EMU_VISIBLE_DEVICES (a comma list of
 * physical numbers, as CUDA_VISIBLE_DEVICES; unset: the identity) reorders them, so that two
 * processes can name one device by different numbers (the emulated NCCL refuses that pair, as
 * NCCL does, by the PCI bus id: 0x10 + the physical number). */
static int physical_device(int dev)
{
    const char *v = getenv("DDP_EMU_VISIBLE_DEVICES");
    for (int i = 0; v && *v; i++) {
        char *end;
        long p = strtol(v, &end, 10);
        if (end == v)
            break;
        if (i == dev)
            return (int)p;
        v = *end == ',' ? end + 1 : end;
    }
    return dev;
}
EMU_API cudaError_t cudaGetDeviceCount(int *n)
{
    if (!n)
        return set_err(cudaErrorInvalidValue);
    *n = n_devices();
    return *n ? cudaSuccess : set_err(cudaErrorNoDevice);
}
EMU_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
    if (!p)
        return set_err(cudaErrorInvalidValue);
    if (dev < 0 || dev >= n_devices())
        return set_err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (emulated on the CPU)");
    p->totalGlobalMem = 80ull << 30;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->pciBusID = 0x10 + physical_device(dev);
    p->l2CacheSize = 50 << 20;
    return cudaSuccess;
}
EMU_API cudaError_t cudaSetDevice(int dev)
{
    if (dev < 0 || dev >= n_devices())
        return set_err(cudaErrorInvalidDevice);
    cur_device = dev;
    return cudaSuccess;
}
EMU_API cudaError_t cudaGetDevice(int *dev)
{
    if (!dev)
        return set_err(cudaErrorInvalidValue);
    *dev = cur_device;
    return cudaSuccess;
}
static void run_all(bool blocking_only);
EMU_API cudaError_t cudaDeviceSynchronize(void)
{
    run_all(false);
    return cudaSuccess;
}

/* ---- memory */
bool emu_rt_dry(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("DDP_EMU_DRYRUN");
        on = v && *v && strcmp(v, "0") != 0;
    }
    return on != 0;
}

static std::mutex mem_m;
/* The device's memory for cudaMalloc and cudaMemGetInfo: 80 GiB, or less after
 * emu_rt_set_mem_limit (a test's out-of-memory: cudaMalloc then fails as on a full GPU). */
static size_t mem_limit = 80ull << 30;
static std::map<uintptr_t, size_t> dev_blocks;  /* cudaMalloc'd: base → bytes */
static std::map<uintptr_t, size_t> host_blocks; /* cudaMallocHost'd and registered */
static size_t dev_bytes;
/* Multiply-adds × 2 of every cuBLAS / cuBLASLt product so far (emu_rt_gemm_flops) */
static std::atomic<size_t> gemm_flops{0};
static size_t dev_peak; /* the most dev_bytes has been (DDP_EMU_PEAK_FILE) */

/* The block of m holding [p, p + n), or end. */
static std::map<uintptr_t, size_t>::iterator find_block(std::map<uintptr_t, size_t> &m,
                                                        const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = m.upper_bound(a);
    if (it == m.begin())
        return m.end();
    --it;
    if (a - it->first > it->second || it->second - (a - it->first) < n)
        return m.end();
    return it;
}
EMU_API int emu_rt_is_device(const void *p, size_t bytes)
{
    std::lock_guard<std::mutex> l(mem_m);
    return find_block(dev_blocks, p, bytes) != dev_blocks.end();
}
/* Aborts unless [p, p + bytes) is device memory. */
static void need_device(const void *p, size_t bytes, const char *what)
{
    if (!emu_rt_is_device(p, bytes)) {
        std::lock_guard<std::mutex> l(mem_m);
        auto it = dev_blocks.upper_bound((uintptr_t)p);
        if (it != dev_blocks.begin()) {
            --it;
            emu_die("%s: %zu bytes at %p run past the end of the cudaMalloc'd block %p of %zu "
                    "bytes (offset %zd)",
                    what, bytes, p, (void *)it->first, it->second,
                    (ssize_t)((uintptr_t)p - it->first));
        }
        emu_die("%s: %p (%zu bytes) is not device memory (no cudaMalloc'd block holds it)", what, p,
                bytes);
    }
}
/* IPC (the header): blocks of IPC_MIN bytes or more are memfd mappings, fd kept for export;
 * peers' blocks opened here are mappings too, released by cudaIpcCloseMemHandle. */
#define IPC_MIN (64u << 10)
static std::map<uintptr_t, int> ipc_fd;        /* this process's memfd blocks: base → fd */
static std::map<uintptr_t, size_t> ipc_opened; /* peers' blocks mapped here: base → bytes */
static std::map<uintptr_t, size_t> dry_maps;   /* a dry run's blocks: base → mapping's bytes */
/* A dry run's block lies between two gaps of this many bytes that fault on any access: a kernel
 * index that wrapped in 32 bits (up to 2³¹ elements of 8 bytes before or after) lands in one, not
 * in a neighbouring block. Address space only (a few TiB for a GPT's few hundred blocks). */
#define DRY_GUARD ((size_t)16 << 30)
/* A dry run does copies and memsets up to this many bytes (the small values host code passes
 * through the device: a collective on host data, the losses) and skips larger ones. */
#define DRY_COPY_MAX ((size_t)1 << 20)
EMU_API cudaError_t cudaMalloc(void **p, size_t bytes)
{
    if (!p)
        return set_err(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> l(mem_m);
    if (dev_bytes + bytes > mem_limit)
        return set_err(cudaErrorMemoryAllocation);
    void *q = nullptr;
    if (emu_rt_dry()) { /* reserved between two DRY_GUARD gaps of no access; never filled */
        const size_t pg = (size_t)sysconf(_SC_PAGESIZE), body = (bytes + pg - 1) / pg * pg,
                     len = body + 2 * DRY_GUARD;
        char *m = (char *)mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                               -1, 0);
        if (m == MAP_FAILED)
            return set_err(cudaErrorMemoryAllocation);
        q = m + DRY_GUARD; /* no access but device work's: dry_window */
        dry_maps[(uintptr_t)q] = len;
        dev_blocks[(uintptr_t)q] = bytes;
        dev_bytes += bytes;
        dev_peak = dev_bytes > dev_peak ? dev_bytes : dev_peak;
        *p = q;
        return cudaSuccess;
    }
    if (bytes >= IPC_MIN) {
        int fd = memfd_create("ddp-gpu-emu", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0 ||
            (q = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
            if (fd >= 0)
                close(fd);
            return set_err(cudaErrorMemoryAllocation);
        }
        ipc_fd[(uintptr_t)q] = fd;
    } else if (posix_memalign(&q, 256, bytes ? bytes : 1))
        return set_err(cudaErrorMemoryAllocation);
    memset(q, 0xff, bytes);
    dev_blocks[(uintptr_t)q] = bytes;
    dev_bytes += bytes;
    dev_peak = dev_bytes > dev_peak ? dev_bytes : dev_peak;
    *p = q;
    return cudaSuccess;
}
/* A dry run's device memory is readable and writable only while queued kernels run (opened by
 * the first of them, closed when the run of the queue that held it ends; copies, memsets and
 * products are not done): a host access to it at any other time — host code reading a device
 * pointer, which works on the emulation's host memory and faults on a GPU — faults here too. */
static int dry_depth; /* under mem_m: nested runs of device work (run_until recurses) */
/* enter: device work starts (the memory opens at the outermost); leave: it ends (closes there). */
static void dry_window(bool enter)
{
    std::lock_guard<std::mutex> l(mem_m);
    if (enter ? dry_depth++ != 0 : --dry_depth != 0)
        return;
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    for (const auto &b : dry_maps) {
        size_t body = (dev_blocks[b.first] + pg - 1) / pg * pg;
        if (body && mprotect((void *)b.first, body, enter ? PROT_READ | PROT_WRITE : PROT_NONE))
            emu_die("mprotect of a dry run's block %p: %s", (void *)b.first, strerror(errno));
    }
}

EMU_API void emu_rt_device_work(int begin)
{
    if (emu_rt_dry())
        dry_window(begin != 0);
}

/* The floating-point operations of the products so far (2·m·n·k a batch entry): what a test
 * reads to see how much work a forward did (test_cuda_gpt: the key/value cache's). */
EMU_API size_t emu_rt_gemm_flops(void)
{
    return gemm_flops.load();
}

/* Bytes of device memory cudaMalloc'd now (tests/emu/scale_gpt.c: a model's footprint). */
EMU_API size_t emu_rt_device_bytes(void)
{
    std::lock_guard<std::mutex> l(mem_m);
    return dev_bytes;
}

/* DDP_EMU_PEAK_FILE=PATH: at exit, the most device memory the process ever had in use, bytes, a
 * line appended to PATH (one per rank: a test's check that a job never held more, e.g. the whole
 * optimizer state while resuming a sharded run). */
namespace
{
struct peak_at_exit {
    ~peak_at_exit()
    {
        const char *path = getenv("DDP_EMU_PEAK_FILE");
        if (!path || !*path)
            return;
        char line[32];
        int n = snprintf(line, sizeof line, "%zu\n", dev_peak);
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            if (write(fd, line, (size_t)n) != n) { /* a test's file: its check then fails */
            }
            close(fd);
        }
    }
} peak_reporter;
} // namespace

/* A test's smaller device: cudaMalloc fails (cudaErrorMemoryAllocation) once more than bytes
 * would be in use, as on a full GPU; 0: the 80 GiB again. Returns the bytes in use now. */
EMU_API size_t emu_rt_set_mem_limit(size_t bytes)
{
    std::lock_guard<std::mutex> l(mem_m);
    mem_limit = bytes ? bytes : 80ull << 30;
    return dev_bytes;
}
/* The device's 80 GiB (cudaGetDeviceProperties' totalGlobalMem; a test's limit), less what this
 * process cudaMalloc'd: no context, library or other process takes any (a GPU's figure has those
 * too). */
/* DDP_EMU_MEMINFO_FAIL=R: the query fails in the process whose RANK is R (a device that does
 * not answer it, for a test of what ddptrain reports then). */
EMU_API cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return set_err(cudaErrorInvalidValue);
    const char *fail_rank = getenv("DDP_EMU_MEMINFO_FAIL"), *rank = getenv("RANK");
    if (fail_rank && !strcmp(fail_rank, rank ? rank : "0"))
        return set_err(cudaErrorNotSupported);
    std::lock_guard<std::mutex> l(mem_m);
    *total_bytes = mem_limit; /* less than in use after a test's emu_rt_set_mem_limit: none free */
    *free_bytes = dev_bytes < mem_limit ? mem_limit - dev_bytes : 0;
    return cudaSuccess;
}
EMU_API cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    run_all(false); /* cudaFree synchronizes the device: queued work may still use p */
    std::lock_guard<std::mutex> l(mem_m);
    if (ipc_opened.count((uintptr_t)p))
        emu_die("cudaFree(%p): a peer's block opened by cudaIpcOpenMemHandle (release it with "
                "cudaIpcCloseMemHandle)",
                p);
    auto it = dev_blocks.find((uintptr_t)p);
    if (it == dev_blocks.end())
        emu_die("cudaFree(%p): not a pointer cudaMalloc returned (or freed twice)", p);
    dev_bytes -= it->second;
    auto dm = dry_maps.find((uintptr_t)p);
    if (dm != dry_maps.end()) {
        munmap((char *)p - DRY_GUARD, dm->second);
        dry_maps.erase(dm);
        dev_blocks.erase(it);
        return cudaSuccess;
    }
    auto f = ipc_fd.find((uintptr_t)p);
    if (f != ipc_fd.end()) {
        munmap(p, it->second);
        close(f->second);
        ipc_fd.erase(f);
    } else
        free(p);
    dev_blocks.erase(it);
    return cudaSuccess;
}
EMU_API cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    if (!p)
        return set_err(cudaErrorInvalidValue);
    void *q = nullptr;
    if (posix_memalign(&q, 256, bytes ? bytes : 1))
        return set_err(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> l(mem_m);
    host_blocks[(uintptr_t)q] = bytes;
    *p = q;
    return cudaSuccess;
}
EMU_API cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    run_all(false);
    std::lock_guard<std::mutex> l(mem_m);
    if (!host_blocks.erase((uintptr_t)p))
        emu_die("cudaFreeHost(%p): not a pointer cudaMallocHost returned", p);
    free(p);
    return cudaSuccess;
}
static std::map<uintptr_t, size_t> registered; /* base → bytes */
EMU_API cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned)
{
    if (!p || !bytes)
        return set_err(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> l(mem_m);
    if (!registered.emplace((uintptr_t)p, bytes).second)
        return set_err(cudaErrorHostMemoryAlreadyRegistered);
    return cudaSuccess;
}
/* Whether [p, p + n) is pinned host memory (cudaMallocHost'd or registered). */
static bool pinned(const void *p, size_t n)
{
    std::lock_guard<std::mutex> l(mem_m);
    return find_block(host_blocks, p, n) != host_blocks.end() ||
           find_block(registered, p, n) != registered.end();
}
EMU_API cudaError_t cudaHostUnregister(void *p)
{
    run_all(false);
    std::lock_guard<std::mutex> l(mem_m);
    if (!registered.erase((uintptr_t)p))
        return set_err(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

/* ---- streams and events: work queued per stream, run when waited for (the header) */
struct CUstream_st {
    unsigned flags;
    std::deque<std::function<bool()>> q; /* queued, not yet run; false: not ready, run again */
    uint64_t issued = 0, done = 0;       /* operations queued and run, since creation */
};
struct CUevent_st {
    unsigned flags;
    cudaStream_t s = nullptr; /* recorded on; NULL: complete */
    uint64_t at = 0;          /* complete once s->done >= at */
};
static std::mutex obj_m;
static std::set<const void *> streams, events;
/* The legacy stream (NULL) as a queue: not in `streams` (no handle names it) but run with them. */
static const cudaStream_t legacy = new CUstream_st(); /* never freed: a thread may run it at exit */
/* Held while queuing, running and waiting: a queued operation runs on the thread that needs it
 * done, one at a time (a kernel's fibers run on that thread). Recursive: an operation that waits
 * for an event on another stream (cudaStreamWaitEvent's) runs that stream's work first. */
static std::recursive_mutex run_m;
static bool deferred(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("DDP_EMU_STREAMS");
        on = !(v && !strcmp(v, "immediate"));
    }
    return on != 0;
}
/* Runs s's queued work until `upto` operations have run (all of it: UINT64_MAX). run_m held.
 * False when the first left is not ready (an emulated NCCL collective waiting for its peers,
 * nccl_emu.cpp): it stays queued and runs again at the next wait, as a GPU kernel that spins. */
static void dry_window(bool enter);
static bool run_until(cudaStream_t s, uint64_t upto)
{
    bool ok = true;
    const bool dry = emu_rt_dry();
    if (dry)
        dry_window(true); /* the device's turn: its work (kernels, NCCL's) may touch it */
    while (s->done < upto && !s->q.empty()) {
        if (!s->q.front()()) {
            ok = false;
            break;
        }
        s->q.pop_front();
        s->done++;
    }
    if (dry)
        dry_window(false); /* the host's turn again, at the outermost run */
    return ok;
}
/* Sleeps between tries of work that is not ready: 20 µs, doubling to 1 ms. */
static void wait_backoff(long *ns)
{
    struct timespec ts = {0, *ns};
    nanosleep(&ts, nullptr);
    if (*ns < 1000000)
        *ns *= 2;
}
/* Runs every stream's queued work (blocking_only: the blocking streams', what the legacy stream
 * waits for). Work that is not ready is tried again with run_m released between tries, so that
 * other threads (a watchdog's cudaEventQuery, ncclCommAbort) go on meanwhile. */
static void run_all(bool blocking_only)
{
    for (long ns = 20000;; wait_backoff(&ns)) {
        std::lock_guard<std::recursive_mutex> r(run_m);
        std::vector<cudaStream_t> all{legacy};
        {
            std::lock_guard<std::mutex> l(obj_m);
            for (const void *p : streams)
                all.push_back((cudaStream_t)p);
        }
        bool pending = false;
        for (bool again = true; again;) { /* a stream's work may wait on another's */
            again = false;
            pending = false;
            for (cudaStream_t s : all)
                if ((!blocking_only || !(s->flags & cudaStreamNonBlocking)) && !s->q.empty()) {
                    uint64_t d = s->done;
                    if (!run_until(s, UINT64_MAX))
                        pending = true;
                    again |= s->done != d;
                }
        }
        if (!pending)
            return;
    }
}
/* Runs s's work up to operation `upto`, trying again (run_m released) while it is not ready. */
static void run_wait(cudaStream_t s, uint64_t upto)
{
    for (long ns = 20000;; wait_backoff(&ns)) {
        std::lock_guard<std::recursive_mutex> r(run_m);
        if (run_until(s, upto))
            return;
    }
}
EMU_API void emu_rt_stream_flush(cudaStream_t s)
{
    if (s)
        run_wait(s, UINT64_MAX);
    else
        run_all(true);
}
/* Where work queued now on s must wait first (deferred streams, run_m held): on the legacy
 * stream, for what every blocking stream has queued so far; on a blocking stream, for what the
 * legacy stream has; a non-blocking stream waits for nothing it did not ask for (an event). */
static std::function<bool()> order_before(cudaStream_t s)
{
    std::vector<std::pair<cudaStream_t, uint64_t>> marks;
    if (s == legacy) {
        std::lock_guard<std::mutex> l(obj_m);
        for (const void *p : streams) {
            cudaStream_t o = (cudaStream_t)p;
            if (!(o->flags & cudaStreamNonBlocking) && o->issued > o->done)
                marks.emplace_back(o, o->issued);
        }
    } else if (!(s->flags & cudaStreamNonBlocking) && legacy->issued > legacy->done)
        marks.emplace_back(legacy, legacy->issued);
    if (marks.empty())
        return nullptr;
    /* no cycle: each mark is what was queued before this work, on another stream */
    return [marks = std::move(marks)] {
        for (const auto &m : marks)
            if (!run_until(m.first, m.second))
                return false;
        return true;
    };
}
/* Queues f (false: not ready, tried again at the next wait) on s (NULL: the legacy stream)
 * behind what it must wait for; run_m held. */
static void queue_on(cudaStream_t s, std::function<bool()> f)
{
    if (!s)
        s = legacy;
    std::function<bool()> first = order_before(s);
    if (first)
        f = [first = std::move(first), f = std::move(f)] { return first() && f(); };
    s->q.push_back(std::move(f));
    s->issued++;
}
/* Queues f on s, or runs it now with DDP_EMU_STREAMS=immediate (on the legacy stream after the
 * blocking streams' work, which runs first). Returns the operation's number on its stream (0 when
 * run now): it has run once s->done reaches it. */
static uint64_t enqueue_at(cudaStream_t s, std::function<void()> f)
{
    if (!deferred()) {
        if (!s)
            run_all(true);
        std::lock_guard<std::recursive_mutex> r(run_m);
        const bool dry = emu_rt_dry();
        if (dry)
            dry_window(true);
        f();
        if (dry)
            dry_window(false);
        return 0;
    }
    std::lock_guard<std::recursive_mutex> r(run_m);
    queue_on(s, [f = std::move(f)] {
        f();
        return true;
    });
    return (s ? s : legacy)->issued; /* read under run_m: not a later operation's number */
}
void emu_rt_enqueue(cudaStream_t s, std::function<void()> f)
{
    enqueue_at(s, std::move(f));
}
/* Queues f and returns once it has run (a copy to or from pageable host memory, cudaMemcpy with
 * a host side): s's earlier work, and what that waits for, first. */
static void enqueue_wait(cudaStream_t s, std::function<void()> f)
{
    if (!deferred()) { /* what is queued even so (an NCCL collective) first, then f at once */
        emu_rt_stream_flush(s);
        emu_rt_enqueue(s, std::move(f));
        return;
    }
    run_wait(s ? s : legacy, enqueue_at(s, std::move(f)));
}
/* Queues f, work that may not be ready (f returns false: tried again at the next wait), on s.
 * Queued even with DDP_EMU_STREAMS=immediate (the caller need not wait for it: an NCCL
 * collective's issue), except on the legacy stream there, where it runs now, trying until it is
 * ready. */
void emu_rt_enqueue_poll(cudaStream_t s, std::function<bool()> f)
{
    if (!s && !deferred()) {
        run_all(true);
        for (long ns = 20000;; wait_backoff(&ns)) {
            std::lock_guard<std::recursive_mutex> r(run_m);
            const bool dry = emu_rt_dry();
            if (dry)
                dry_window(true);
            bool done = f();
            if (dry)
                dry_window(false);
            if (done)
                return;
        }
    }
    std::lock_guard<std::recursive_mutex> r(run_m);
    queue_on(s, std::move(f));
}
static void need_stream(cudaStream_t s, const char *what)
{
    if (!s)
        return;
    std::lock_guard<std::mutex> l(obj_m);
    if (!streams.count(s))
        emu_die("%s: stream %p was never created or is destroyed", what, (void *)s);
}
static void need_event(cudaEvent_t e, const char *what)
{
    std::lock_guard<std::mutex> l(obj_m);
    if (!events.count(e))
        emu_die("%s: event %p was never created or is destroyed", what, (void *)e);
}
EMU_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    if (!s)
        return set_err(cudaErrorInvalidValue);
    *s = new CUstream_st();
    (*s)->flags = flags;
    std::lock_guard<std::mutex> l(obj_m);
    streams.insert(*s);
    return cudaSuccess;
}
EMU_API cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, 0);
}
EMU_API cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    need_stream(s, "cudaStreamDestroy");
    if (!s)
        return set_err(cudaErrorInvalidResourceHandle);
    /* its work completes (CUDA: destroy returns at once, the work still runs); every stream's,
     * since another's queued wait may name an event on this one */
    run_all(false);
    std::lock_guard<std::recursive_mutex> r(run_m);
    std::lock_guard<std::mutex> l(obj_m);
    for (const void *p : events) /* their work is done: complete, not a pointer to freed memory */
        if (((cudaEvent_t)p)->s == s)
            ((cudaEvent_t)p)->s = nullptr;
    streams.erase(s);
    delete s;
    return cudaSuccess;
}
EMU_API cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    need_stream(s, "cudaStreamSynchronize");
    emu_rt_stream_flush(s);
    return cudaSuccess;
}
EMU_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned)
{
    need_stream(s, "cudaStreamWaitEvent");
    need_event(e, "cudaStreamWaitEvent");
    std::lock_guard<std::recursive_mutex> r(run_m);
    cudaStream_t es = e->s;
    uint64_t at = e->at;
    if (!es || es == (s ? s : legacy))
        return cudaSuccess;
    emu_rt_enqueue_poll(s, [es, at] { return run_until(es, at); });
    return cudaSuccess;
}
EMU_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    if (!e)
        return set_err(cudaErrorInvalidValue);
    *e = new CUevent_st();
    (*e)->flags = flags;
    std::lock_guard<std::mutex> l(obj_m);
    events.insert(*e);
    return cudaSuccess;
}
EMU_API cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, 0);
}
EMU_API cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    need_event(e, "cudaEventDestroy");
    std::lock_guard<std::recursive_mutex> r(run_m);
    std::lock_guard<std::mutex> l(obj_m);
    events.erase(e);
    delete e;
    return cudaSuccess;
}
EMU_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    need_event(e, "cudaEventRecord");
    need_stream(s, "cudaEventRecord");
    if (!s && !deferred()) { /* the legacy stream, at once: after the blocking streams' work */
        run_all(true);
        std::lock_guard<std::recursive_mutex> r(run_m);
        e->s = nullptr;
        return cudaSuccess;
    }
    std::lock_guard<std::recursive_mutex> r(run_m); /* held: no other operation in between */
    if (!s) { /* on the legacy stream, after the blocking streams' earlier work: a mark queued */
        e->s = legacy;
        e->at = enqueue_at(nullptr, [] {});
    } else {
        e->s = s;
        e->at = s->issued;
    }
    return cudaSuccess;
}
EMU_API cudaError_t cudaEventQuery(cudaEvent_t e)
{
    need_event(e, "cudaEventQuery");
    std::lock_guard<std::recursive_mutex> r(run_m);
    if (e->s && !run_until(e->s, e->at))
        return cudaErrorNotReady; /* not sticky: cudaGetLastError does not return it */
    return cudaSuccess;
}
EMU_API cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    need_event(e, "cudaEventSynchronize");
    cudaStream_t s;
    uint64_t at;
    {
        std::lock_guard<std::recursive_mutex> r(run_m);
        s = e->s, at = e->at;
    }
    if (s)
        run_wait(s, at);
    return cudaSuccess;
}

/* ---- copies */
/* The copy's checks (at the call, as CUDA's): 0 or an error set; cudaMemcpyDefault resolved. */
static cudaError_t copy_check(void *dst, const void *src, size_t n, cudaMemcpyKind *k,
                              const char *what)
{
    if ((unsigned)*k > cudaMemcpyDefault)
        return set_err(cudaErrorInvalidMemcpyDirection);
    if (*k == cudaMemcpyDefault) {
        bool dd = emu_rt_is_device(dst, n), sd = emu_rt_is_device(src, n);
        *k = dd && sd ? cudaMemcpyDeviceToDevice
             : dd     ? cudaMemcpyHostToDevice
             : sd     ? cudaMemcpyDeviceToHost
                      : cudaMemcpyHostToHost;
    }
    if (*k == cudaMemcpyHostToDevice || *k == cudaMemcpyDeviceToDevice)
        need_device(dst, n, what);
    if (*k == cudaMemcpyDeviceToHost || *k == cudaMemcpyDeviceToDevice)
        need_device(src, n, what);
    if ((char *)dst < (const char *)src + n && (const char *)src < (char *)dst + n && dst != src)
        emu_die("%s: the %zu-byte source %p and destination %p overlap", what, n, src, dst);
    return cudaSuccess;
}
/* A copy on stream s (NULL: the legacy stream); async: cudaMemcpyAsync's, else cudaMemcpy's.
 * From pageable host memory, or into it, CUDA copies in the stream's turn and returns when done
 * (the host buffer may be reused at once), as cudaMemcpy does with any host side; between pinned
 * host memory and the device, or device to device, cudaMemcpyAsync's stays queued, as
 * cudaMemcpy's between device buffers. */
static cudaError_t copy_on(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s,
                           bool async, const char *what)
{
    if (n == 0)
        return cudaSuccess;
    cudaError_t e = copy_check(dst, src, n, &k, what);
    if (e)
        return e;
    if (emu_rt_dry() && n > DRY_COPY_MAX) { /* not done; a host destination gets zeros */
        if (k == cudaMemcpyDeviceToHost)
            memset(dst, 0, n);
        else if (k == cudaMemcpyHostToHost)
            memmove(dst, src, n);
        return cudaSuccess;
    }
    const bool now = async ? (k == cudaMemcpyHostToDevice && !pinned(src, n)) ||
                                 (k == cudaMemcpyDeviceToHost && !pinned(dst, n)) ||
                                 k == cudaMemcpyHostToHost
                           : k != cudaMemcpyDeviceToDevice;
    if (now) /* the copy is device work: run_until opens a dry run's window for it */
        enqueue_wait(s, [dst, src, n] { memcpy(dst, src, n); });
    else
        emu_rt_enqueue(s, [dst, src, n] { memcpy(dst, src, n); });
    return cudaSuccess;
}
EMU_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    return copy_on(dst, src, n, k, nullptr, false, "cudaMemcpy");
}
EMU_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k,
                                    cudaStream_t s)
{
    need_stream(s, "cudaMemcpyAsync");
    return copy_on(dst, src, n, k, s, true, "cudaMemcpyAsync");
}
EMU_API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                      size_t width, size_t height, cudaMemcpyKind k, cudaStream_t s)
{
    need_stream(s, "cudaMemcpy2DAsync");
    if (width > dpitch || width > spitch)
        return set_err(cudaErrorInvalidValue); /* as CUDA: pitches below the width */
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = copy_on((char *)dst + r * dpitch, (const char *)src + r * spitch, width, k,
                                s, true, "cudaMemcpy2DAsync");
        if (e)
            return e;
    }
    return cudaSuccess;
}
EMU_API cudaError_t cudaMemset(void *dst, int v, size_t n)
{
    if (n)
        need_device(dst, n, "cudaMemset");
    if (emu_rt_dry() && n > DRY_COPY_MAX)
        return cudaSuccess;
    emu_rt_enqueue(nullptr, [dst, v, n] { memset(dst, v, n); });
    return cudaSuccess;
}
EMU_API cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
    need_stream(s, "cudaMemsetAsync");
    if (n)
        need_device(dst, n, "cudaMemsetAsync");
    if (emu_rt_dry() && n > DRY_COPY_MAX)
        return cudaSuccess;
    emu_rt_enqueue(s, [dst, v, n] { memset(dst, v, n); });
    return cudaSuccess;
}
/* What an emulated handle holds (inside cudaIpcMemHandle_t's 64 bytes). */
struct emu_ipc {
    uint64_t magic;
    int64_t pid, fd;
    uint64_t bytes;
};
static const uint64_t IPC_MAGIC = 0x1bcde7a1c0de0002ull;
EMU_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
    static_assert(sizeof(emu_ipc) <= sizeof(cudaIpcMemHandle_t), "a handle holds emu_ipc");
    if (!h || !p)
        return set_err(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> l(mem_m);
    auto b = find_block(dev_blocks, p, 1);
    if (b == dev_blocks.end())
        emu_die("cudaIpcGetMemHandle(%p): not device memory", p);
    if (b->first != (uintptr_t)p)
        emu_die("cudaIpcGetMemHandle(%p): %zu bytes into the block at %p: a handle names the "
                "whole allocation, and the peer that opens it gets the block's start, not this "
                "pointer (pass the offset beside the handle)",
                p, (size_t)((uintptr_t)p - b->first), (void *)b->first);
    if (ipc_opened.count(b->first))
        return set_err(cudaErrorInvalidValue); /* a peer's block is not this process's to export */
    auto f = ipc_fd.find(b->first);
    if (f == ipc_fd.end())
        return set_err(cudaErrorNotSupported); /* the emulation's limit: blocks under IPC_MIN */
    emu_ipc e = {IPC_MAGIC, (int64_t)getpid(), (int64_t)f->second, (uint64_t)b->second};
    memset(h, 0, sizeof *h);
    memcpy(h, &e, sizeof e);
    return cudaSuccess;
}
EMU_API cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned)
{
    emu_ipc e;
    memcpy(&e, &h, sizeof e);
    if (!p || e.magic != IPC_MAGIC)
        return set_err(cudaErrorInvalidValue);
    if (e.pid == (int64_t)getpid())
        return set_err(cudaErrorDeviceUninitialized); /* CUDA: not in the exporting process */
    char path[64];
    snprintf(path, sizeof path, "/proc/%lld/fd/%lld", (long long)e.pid, (long long)e.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return set_err(cudaErrorInvalidValue); /* the exporter is gone */
    void *q = mmap(nullptr, e.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (q == MAP_FAILED)
        return set_err(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> l(mem_m);
    dev_blocks[(uintptr_t)q] = e.bytes;
    ipc_opened[(uintptr_t)q] = e.bytes;
    *p = q;
    return cudaSuccess;
}
EMU_API cudaError_t cudaIpcCloseMemHandle(void *p)
{
    run_all(false); /* queued work may still read it */
    std::lock_guard<std::mutex> l(mem_m);
    auto o = ipc_opened.find((uintptr_t)p);
    if (o == ipc_opened.end())
        return set_err(cudaErrorInvalidValue);
    munmap(p, o->second);
    dev_blocks.erase(o->first);
    ipc_opened.erase(o);
    return cudaSuccess;
}

/* ---- launches */
static std::atomic<int> smem_optin{48 << 10};
EMU_API cudaError_t cudaFuncSetAttribute(const void *fn, cudaFuncAttribute a, int v)
{
    if (!fn)
        return set_err(cudaErrorInvalidValue);
    if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (v < 0 || v > (227 << 10))
            return set_err(cudaErrorInvalidValue);
        int o = smem_optin.load();
        while (o < v && !smem_optin.compare_exchange_weak(o, v)) {
        }
    }
    return cudaSuccess;
}
cudaError_t emu_rt_launch_check(const char *name, dim3 g, dim3 b, size_t smem, cudaStream_t s)
{
    need_stream(s, name);
    unsigned long long nt = (unsigned long long)b.x * b.y * b.z;
    cudaError_t e = cudaSuccess;
    if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 || nt > 1024 ||
        g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535)
        e = cudaErrorInvalidConfiguration;
    else if (smem > (size_t)smem_optin.load())
        e = cudaErrorInvalidValue;
    if (e && getenv("DDP_EMU_VERBOSE"))
        fprintf(stderr,
                "gpu emulation: launch of %s refused: grid %u×%u×%u, block %u×%u×%u, %zu "
                "bytes of shared memory: %s\n",
                name, g.x, g.y, g.z, b.x, b.y, b.z, smem, cudaGetErrorName(e));
    return set_err(e);
}

/* ---- cuBLAS and cuBLASLt: plain loops */
static size_t type_size(cudaDataType_t t)
{
    return t == CUDA_R_32F ? 4 : t == CUDA_R_64F ? 8 : t == CUDA_R_16F || t == CUDA_R_16BF ? 2 : 0;
}
static const char *type_name(cudaDataType_t t)
{
    return t == CUDA_R_32F    ? "fp32"
           : t == CUDA_R_16F  ? "fp16"
           : t == CUDA_R_16BF ? "bf16"
           : t == CUDA_R_64F  ? "fp64"
                              : "another type";
}
static float tf32(float x) /* round to nearest (even) at 10 mantissa bits */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0xfffu + ((u >> 13) & 1)) & ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}
static double ld_el(cudaDataType_t t, const void *p, size_t i, bool round_tf32)
{
    switch (t) {
    case CUDA_R_32F: {
        float v = ((const float *)p)[i];
        return round_tf32 ? tf32(v) : v;
    }
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_16F: return ddp__f16_to_f32(((const uint16_t *)p)[i]);
    case CUDA_R_16BF: return ddp__bf16_to_f32(((const uint16_t *)p)[i]);
    default: emu_die("cuBLAS: loading an element of %s", type_name(t));
    }
}
static void st_el(cudaDataType_t t, void *p, size_t i, double v)
{
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    case CUDA_R_64F: ((double *)p)[i] = v; break;
    case CUDA_R_16F: ((uint16_t *)p)[i] = ddp__f32_to_f16((float)v); break;
    case CUDA_R_16BF: ((uint16_t *)p)[i] = ddp__f32_to_bf16((float)v); break;
    default: emu_die("cuBLAS: storing an element of %s", type_name(t));
    }
}
static double gelu(double x)
{
    const double k = 0.7978845608028654; /* sqrt(2/pi), tanh GELU as cuBLASLt's */
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}
static double dgelu(double x)
{
    const double k = 0.7978845608028654;
    double u = k * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

/* One matrix operand: type, stored rows × cols (column-major), leading dimension, batches. */
struct mat {
    cudaDataType_t t;
    uint64_t rows, cols;
    int64_t ld;
    int batch = 1;
    int64_t stride = 0;
};
/* Aborts unless the operand's elements all lie in one cudaMalloc'd block. */
static void need_operand(const char *call, const char *what, const void *p, const mat &m)
{
    if (m.ld < (int64_t)std::max<uint64_t>(1, m.rows))
        emu_die("%s: %s is %llu × %llu (column-major) with leading dimension %lld < its %llu rows "
                "(cuBLAS refuses it: CUBLAS_STATUS_INVALID_VALUE)",
                call, what, (unsigned long long)m.rows, (unsigned long long)m.cols, (long long)m.ld,
                (unsigned long long)m.rows);
    if (m.rows == 0 || m.cols == 0)
        return;
    if (!p)
        emu_die("%s: %s is NULL", call, what);
    size_t es = type_size(m.t);
    if ((uintptr_t)p % es)
        emu_die("%s: %s at %p is not aligned to its %s elements", call, what, p, type_name(m.t));
    size_t last = (size_t)((m.cols - 1) * m.ld + m.rows) + (size_t)(m.batch - 1) * m.stride;
    char buf[160];
    snprintf(buf, sizeof buf, "%s: %s (%llu × %llu, ld %lld, %d batches of stride %lld, %s)", call,
             what, (unsigned long long)m.rows, (unsigned long long)m.cols, (long long)m.ld, m.batch,
             (long long)m.stride, type_name(m.t));
    need_device(p, last * es, buf);
}

struct epi_args {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    cudaDataType_t bias_t = CUDA_R_32F;
    void *aux = nullptr;
    int64_t aux_ld = 0;
    cudaDataType_t aux_t = CUDA_R_32F;
};

/* D = epilogue(alpha · op(A) · op(B) + beta · C), every batch; m × n × k; checked. */
static void gemm_core(const char *call, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                      int k, double alpha, const void *A, const mat &ma, const void *B,
                      const mat &mb, double beta, const void *C, const mat &mc, void *D,
                      const mat &md, bool tf, const epi_args &ep)
{
    if (m < 0 || n < 0 || k < 0)
        emu_die("%s: negative size %d × %d × %d", call, m, n, k);
    if (ta == CUBLAS_OP_C || tb == CUBLAS_OP_C)
        emu_die("%s: conjugate transposes of real matrices", call);
    auto want = [&](const char *what, const mat &x, uint64_t r, uint64_t c) {
        if (x.rows != r || x.cols != c)
            emu_die("%s: %s is stored %llu × %llu but the product needs %llu × %llu", call, what,
                    (unsigned long long)x.rows, (unsigned long long)x.cols, (unsigned long long)r,
                    (unsigned long long)c);
    };
    want("A", ma, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m);
    want("B", mb, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k);
    want("C", mc, m, n);
    want("D", md, m, n);
    int batch = md.batch;
    if (ma.batch != batch || mb.batch != batch || mc.batch != batch)
        emu_die("%s: batch counts differ (A %d, B %d, C %d, D %d)", call, ma.batch, mb.batch,
                mc.batch, batch);
    gemm_flops += 2 * (size_t)m * (size_t)n * (size_t)k * (size_t)batch;
    need_operand(call, "A", A, ma);
    need_operand(call, "B", B, mb);
    if (beta != 0.0)
        need_operand(call, "C", C, mc);
    need_operand(call, "D", D, md);
    const unsigned e = ep.epi;
    const bool has_bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
                          e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool gelu_on = e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                         e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool aux_out = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool aux_in = e == CUBLASLT_EPILOGUE_DGELU;
    const bool relu = e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS;
    if (has_bias) {
        if (!ep.bias)
            emu_die("%s: a bias epilogue without a bias pointer", call);
        mat bm{ep.bias_t, (uint64_t)m, 1, std::max<int64_t>(1, m)};
        need_operand(call, "the bias", ep.bias, bm);
    }
    if (aux_out || aux_in) {
        if (!ep.aux)
            emu_die("%s: a GELU aux epilogue without an aux pointer", call);
        mat am{ep.aux_t, (uint64_t)m, (uint64_t)n, ep.aux_ld};
        need_operand(call, "the GELU aux", ep.aux, am);
    }
    if (m == 0 || n == 0 || emu_rt_dry()) /* a dry run: checked, not computed */
        return;
    const size_t ea = type_size(ma.t), eb = type_size(mb.t), ec = type_size(mc.t),
                 ed = type_size(md.t);
    std::vector<double> acc((size_t)m * n), opa((size_t)m * k), opb((size_t)n * k);
    for (int bi = 0; bi < batch; bi++) {
        const char *a = (const char *)A + (size_t)bi * ma.stride * ea;
        const char *b = (const char *)B + (size_t)bi * mb.stride * eb;
        const char *c = (const char *)C + (size_t)bi * mc.stride * ec;
        char *d = (char *)D + (size_t)bi * md.stride * ed;
        /* op(A) row by row and op(B) column by column, widened once */
        for (int i = 0; i < m; i++)
            for (int l = 0; l < k; l++)
                opa[(size_t)i * k + l] = ld_el(
                    ma.t, a, ta == CUBLAS_OP_N ? i + (size_t)l * ma.ld : l + (size_t)i * ma.ld, tf);
        for (int j = 0; j < n; j++)
            for (int l = 0; l < k; l++)
                opb[(size_t)j * k + l] = ld_el(
                    mb.t, b, tb == CUBLAS_OP_N ? l + (size_t)j * mb.ld : j + (size_t)l * mb.ld, tf);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const double *x = &opa[(size_t)i * k], *y = &opb[(size_t)j * k];
                double s = 0.0;
                for (int l = 0; l < k; l++)
                    s += x[l] * y[l];
                double v = alpha * s;
                if (beta != 0.0)
                    v += beta * ld_el(mc.t, c, i + (size_t)j * mc.ld, false);
                acc[i + (size_t)j * m] = v;
            }
        /* C may be D: read all of it before writing */
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double v = acc[i + (size_t)j * m];
                if (has_bias)
                    v += ld_el(ep.bias_t, ep.bias, i, false);
                if (aux_out)
                    st_el(ep.aux_t, ep.aux, i + (size_t)j * ep.aux_ld, v);
                if (gelu_on)
                    v = gelu(v);
                if (relu)
                    v = v > 0 ? v : 0;
                if (aux_in)
                    v *= dgelu(ld_el(ep.aux_t, ep.aux, i + (size_t)j * ep.aux_ld, false));
                st_el(md.t, d, i + (size_t)j * md.ld, v);
            }
    }
}

/* Whether the types and compute type are a combination cuBLAS offers (the module's). */
static bool types_ok(cudaDataType_t ab, cudaDataType_t cd, cublasComputeType_t compute)
{
    if (compute == CUBLAS_COMPUTE_32F_FAST_TF32)
        return ab == CUDA_R_32F && cd == CUDA_R_32F;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC)
        return false;
    if (ab == CUDA_R_32F)
        return cd == CUDA_R_32F;
    if (ab == CUDA_R_16F || ab == CUDA_R_16BF)
        return cd == ab || cd == CUDA_R_32F;
    return false;
}

struct cublasContext {
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
};
EMU_API cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    if (!h)
        return CUBLAS_STATUS_INVALID_VALUE;
    *h = new cublasContext{};
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    need_stream(s, "cublasSetStream");
    h->stream = s;
    h->ws = nullptr, h->ws_bytes = 0; /* back to cuBLAS's own pool, as the library does */
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t)
{
    return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
EMU_API cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes)
        need_device(ws, bytes, "cublasSetWorkspace");
    if ((uintptr_t)ws % 256)
        return CUBLAS_STATUS_INVALID_VALUE;
    h->ws = ws, h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "an internal operation failed";
    }
}
static cublasStatus_t gemm_ex(const char *call, cublasHandle_t h, cublasOperation_t ta,
                              cublasOperation_t tb, int m, int n, int k, const void *alpha,
                              const void *A, cudaDataType_t at, int lda, long long sa,
                              const void *B, cudaDataType_t bt, int ldb, long long sb,
                              const void *beta, void *C, cudaDataType_t ct, int ldc, long long sc,
                              int batch, cublasComputeType_t compute)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (at != bt || !types_ok(at, ct, compute))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        emu_die("%s: negative size %d × %d × %d (%d batches)", call, m, n, k, batch);
    if (batch == 0 || m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    if (!alpha || !beta)
        emu_die("%s: alpha or beta NULL", call);
    mat ma{at,
           (uint64_t)(ta == CUBLAS_OP_N ? m : k),
           (uint64_t)(ta == CUBLAS_OP_N ? k : m),
           lda,
           batch,
           sa};
    mat mb{bt,
           (uint64_t)(tb == CUBLAS_OP_N ? k : n),
           (uint64_t)(tb == CUBLAS_OP_N ? n : k),
           ldb,
           batch,
           sb};
    mat mc{ct, (uint64_t)m, (uint64_t)n, ldc, batch, sc};
    /* cuBLAS checks the leading dimensions even of an empty operand (k = 0) */
    if (ma.ld < (int64_t)std::max<uint64_t>(1, ma.rows) ||
        mb.ld < (int64_t)std::max<uint64_t>(1, mb.rows))
        emu_die("%s: lda %d / ldb %d below the stored rows (%llu / %llu): cuBLAS refuses it", call,
                lda, ldb, (unsigned long long)ma.rows, (unsigned long long)mb.rows);
    if (batch > 1 && (sc < (long long)ldc * n && sc != 0))
        fprintf(stderr, "gpu emulation: %s: C's batches overlap (stride %lld < %d × %d)\n", call,
                sc, ldc, n);
    /* host scalars read at the call (cuBLAS's host pointer mode); the product runs in turn */
    const float a = *(const float *)alpha, b = *(const float *)beta;
    const bool tf = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    emu_rt_enqueue(h->stream, [=] {
        gemm_core(call, ta, tb, m, n, k, a, A, ma, B, mb, b, C, mc, C, mc, tf, epi_args{});
    });
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                    int m, int n, int k, const void *alpha, const void *A,
                                    cudaDataType_t at, int lda, const void *B, cudaDataType_t bt,
                                    int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                                    cublasComputeType_t compute, cublasGemmAlgo_t)
{
    return gemm_ex("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C,
                   ct, ldc, 0, 1, compute);
}
EMU_API cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType_t at, int lda, long long sa, const void *B,
    cudaDataType_t bt, int ldb, long long sb, const void *beta, void *C, cudaDataType_t ct, int ldc,
    long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t)
{
    return gemm_ex("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt,
                   ldb, sb, beta, C, ct, ldc, sc, batch, compute);
}

/* cuBLASLt */
struct cublasLtContext {
    int dummy;
};
struct cublasLtMatmulDescOpaque_st {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    epi_args ep;
    bool bias_t_set = false, aux_t_set = false;
};
struct cublasLtMatrixLayoutOpaque_st {
    mat m;
};
struct cublasLtMatmulPreferenceOpaque_st {
    uint64_t ws = 0;
    uint32_t align[4] = {256, 256, 256, 256};
};
static const uint64_t ALGO_MAGIC = 0xe7a1c0de5eed0001ull;
EMU_API cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    if (!h)
        return CUBLAS_STATUS_INVALID_VALUE;
    *h = new cublasLtContext{};
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d,
                                                cublasComputeType_t compute, cudaDataType_t scale)
{
    if (!d)
        return CUBLAS_STATUS_INVALID_VALUE;
    *d = new cublasLtMatmulDescOpaque_st{};
    (*d)->compute = compute;
    (*d)->scale = scale;
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
/* An attribute's value of exactly `want` bytes (cuBLASLt: INVALID_VALUE otherwise). */
static bool attr_size(const char *what, int a, size_t got, size_t want)
{
    if (got == want)
        return true;
    fprintf(stderr, "gpu emulation: %s attribute %d set with %zu bytes, its type has %zu\n", what,
            a, got, want);
    return false;
}
EMU_API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                      cublasLtMatmulDescAttributes_t a,
                                                      const void *buf, size_t size)
{
    if (!d || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    const char *w = "matmul descriptor";
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        int32_t v;
        if (!attr_size(w, a, size, 4))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&v, buf, 4);
        (a == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = (cublasOperation_t)v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        uint32_t v;
        if (!attr_size(w, a, size, 4))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&v, buf, 4);
        d->ep.epi = (cublasLtEpilogue_t)v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: {
        void *v;
        if (!attr_size(w, a, size, sizeof v))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&v, buf, sizeof v);
        if (a == CUBLASLT_MATMUL_DESC_BIAS_POINTER)
            d->ep.bias = v;
        else
            d->ep.aux = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: {
        if (!attr_size(w, a, size, 8))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->ep.aux_ld, buf, 8);
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: {
        int32_t v;
        if (!attr_size(w, a, size, 4))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&v, buf, 4);
        if (a == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE)
            d->ep.bias_t = (cudaDataType_t)v, d->bias_t_set = true;
        else if (a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE)
            d->ep.aux_t = (cudaDataType_t)v, d->aux_t_set = true;
        else if (a == CUBLASLT_MATMUL_DESC_SCALE_TYPE)
            d->scale = (cudaDataType_t)v;
        else
            d->compute = (cublasComputeType_t)v;
        return CUBLAS_STATUS_SUCCESS;
    }
    default:
        fprintf(stderr, "gpu emulation: matmul descriptor attribute %d not emulated\n", (int)a);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}
EMU_API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t,
                                                  uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!l)
        return CUBLAS_STATUS_INVALID_VALUE;
    *l = new cublasLtMatrixLayoutOpaque_st{mat{t, rows, cols, ld}};
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                        cublasLtMatrixLayoutAttribute_t a,
                                                        const void *buf, size_t size)
{
    if (!l || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
        if (!attr_size("layout", a, size, 4))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->m.batch, buf, 4);
    } else if (a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) {
        if (!attr_size("layout", a, size, 8))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->m.stride, buf, 8);
    } else if (a == CUBLASLT_MATRIX_LAYOUT_LD) {
        if (!attr_size("layout", a, size, 8))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->m.ld, buf, 8);
    } else
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    if (!p)
        return CUBLAS_STATUS_INVALID_VALUE;
    *p = new cublasLtMatmulPreferenceOpaque_st{};
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                            cublasLtMatmulPreferenceAttributes_t a,
                                                            const void *buf, size_t size)
{
    if (!p || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    const char *w = "matmul preference";
    switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if (!attr_size(w, a, size, 8))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->ws, buf, 8);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if (!attr_size(w, a, size, 4))
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
        return attr_size(w, a, size, 4) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}
/* The descriptor's effective epilogue types; NOT_SUPPORTED / INVALID_VALUE as the header says. */
static cublasStatus_t lt_check(cublasLtMatmulDesc_t d, const mat &a, const mat &b, const mat &c,
                               const mat &dl, epi_args &ep)
{
    ep = d->ep;
    if (!d->bias_t_set)
        ep.bias_t = dl.t;
    if (!d->aux_t_set)
        ep.aux_t = dl.t;
    if (d->scale != CUDA_R_32F || a.t != b.t || c.t != dl.t || !types_ok(a.t, dl.t, d->compute))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a.rows == 0 || a.cols == 0 || b.rows == 0 || b.cols == 0 || dl.rows == 0 || dl.cols == 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (ep.epi) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_GELU: break;
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
        if (ep.bias_t != dl.t)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        if (ep.bias_t != dl.t)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        [[fallthrough]];
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_DGELU:
        if (ep.aux_ld % 8 != 0 || ep.aux_ld < (int64_t)dl.rows)
            return CUBLAS_STATUS_INVALID_VALUE;
        if (ep.aux_t != dl.t)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
    cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p,
    int requested, cublasLtMatmulHeuristicResult_t *results, int *found)
{
    if (!h || !d || !a || !b || !c || !dl || !p || requested < 1 || !results || !found)
        return CUBLAS_STATUS_INVALID_VALUE;
    *found = 0;
    epi_args ep;
    cublasStatus_t s = lt_check(d, a->m, b->m, c->m, dl->m, ep);
    if (s && getenv("DDP_EMU_VERBOSE"))
        fprintf(stderr,
                "gpu emulation: the heuristic refuses epilogue %d (%s × %s → %s, bias %s): %s\n",
                (int)ep.epi, type_name(a->m.t), type_name(b->m.t), type_name(dl->m.t),
                type_name(ep.bias_t), cublasGetStatusString(s));
    if (s)
        return s;
    /* the promised alignments must at least be the elements' */
    for (int i = 0; i < 4; i++)
        if (p->align[i] == 0 || p->align[i] % type_size(i < 2 ? a->m.t : dl->m.t))
            return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(results, 0, sizeof *results);
    results->algo.data[0] = ALGO_MAGIC;
    results->algo.data[1] = p->align[0] | (uint64_t)p->align[1] << 16 |
                            (uint64_t)p->align[2] << 32 | (uint64_t)p->align[3] << 48;
    results->workspaceSize = 0;
    results->state = CUBLAS_STATUS_SUCCESS;
    results->wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}
static uint32_t align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t r = 256;
    while (r > 1 && a % r)
        r /= 2;
    return r;
}
EMU_API cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                                      const void *A, cublasLtMatrixLayout_t la, const void *B,
                                      cublasLtMatrixLayout_t lb, const void *beta, const void *C,
                                      cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                                      const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
                                      cudaStream_t s)
{
    const char *call = "cublasLtMatmul";
    if (!h || !d || !la || !lb || !lc || !ld || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    need_stream(s, call);
    if (ws_bytes)
        need_device(ws, ws_bytes, "cublasLtMatmul's workspace");
    epi_args ep;
    cublasStatus_t st = lt_check(d, la->m, lb->m, lc->m, ld->m, ep);
    if (st)
        return st;
    if (algo) {
        if (algo->data[0] != ALGO_MAGIC)
            emu_die("%s: an algorithm no heuristic returned", call);
        /* the alignments the heuristic was promised must hold */
        const void *ptrs[4] = {A, B, C, D};
        const char *names[4] = {"A", "B", "C", "D"};
        for (int i = 0; i < 4; i++) {
            uint32_t promised = (uint32_t)(algo->data[1] >> (16 * i)) & 0xffff;
            if (align_of(ptrs[i]) < promised)
                emu_die("%s: %s at %p is %u-byte aligned, the heuristic was told %u", call,
                        names[i], ptrs[i], align_of(ptrs[i]), promised);
        }
    }
    const unsigned e = ep.epi;
    if ((e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS) &&
        (uintptr_t)ep.bias % 16)
        return CUBLAS_STATUS_INVALID_VALUE; /* the epilogue loads the bias in vectors */
    if ((e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU) &&
        (uintptr_t)ep.aux % 16)
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool inplace = C == D;
    if (inplace && lc->m.ld != ld->m.ld)
        return CUBLAS_STATUS_INVALID_VALUE; /* in place needs C's layout = D's */
    const int m = (int)ld->m.rows, n = (int)ld->m.cols;
    const int k = (int)(d->ta == CUBLAS_OP_N ? la->m.cols : la->m.rows);
    /* everything the product needs copied now (the caller may destroy the descriptors at once) */
    const float a = *(const float *)alpha, b = *(const float *)beta;
    const cublasOperation_t ta = d->ta, tb = d->tb;
    const bool tf = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    const mat ma = la->m, mb = lb->m, mc = lc->m, md = ld->m;
    emu_rt_enqueue(
        s, [=] { gemm_core(call, ta, tb, m, n, k, a, A, ma, B, mb, b, C, mc, D, md, tf, ep); });
    return CUBLAS_STATUS_SUCCESS;
}
