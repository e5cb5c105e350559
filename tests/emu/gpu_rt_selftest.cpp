/*
 * tests/emu/gpu_rt_selftest.cpp — gpu_emu.runtime: the emulated CUDA runtime and cuBLAS(Lt)
 * (gpu_rt_emu.cpp) refuse what the hardware and the libraries refuse: launch geometry and shared
 * memory as cudaGetLastError errors; copies past a buffer, a cuBLAS leading dimension below the
 * rows, an operand past its buffer, a broken alignment promise as aborts (each in a child);
 * a product with the GELU_AUX_BIAS epilogue against a loop; streams' late work (what is not
 * ordered after a stream's work by an event does not see it; the legacy stream ordered with
 * blocking streams only); and IPC handles as CUDA's.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include "selftest_check.h"

static void kern(int *p)
{
    p[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

static void set7(int *p, int v)
{
    p[threadIdx.x] = v;
}

/* Work runs late, as on a GPU (unless DDP_EMU_STREAMS=immediate): what is not ordered after it
 * does not see it. d: device memory of ≥ 64 ints. */
static void streams(int *d)
{
    if (getenv("DDP_EMU_STREAMS"))
        return;
    cudaStream_t a, b;
    cudaEvent_t e;
    static int h[64], *pin = nullptr;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaMallocHost((void **)&pin, 64 * sizeof(int)) == cudaSuccess);
    cudaMemset(d, 0, 64 * sizeof(int));
    emu_rt_launch(
        "set7", [=] { set7(d, 7); }, dim3(1), dim3(32), 0, a);
    /* the legacy stream (cudaMemcpy) does not wait for a non-blocking stream's kernel */
    CHECK(cudaMemcpy(h, d, 32 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 0);
    /* nor does another stream's copy without an event between them */
    CHECK(cudaMemcpyAsync(d + 32, d, 32 * sizeof(int), cudaMemcpyDeviceToDevice, b) == cudaSuccess);
    CHECK(cudaStreamSynchronize(b) == cudaSuccess);
    CHECK(cudaMemcpy(h, d + 32, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 0);
    /* with one, it does; and the event's query runs the kernel */
    CHECK(cudaEventRecord(e, a) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
    CHECK(cudaMemcpyAsync(d + 32, d, 32 * sizeof(int), cudaMemcpyDeviceToDevice, b) == cudaSuccess);
    CHECK(cudaMemcpyAsync(h, d + 32, sizeof(int), cudaMemcpyDeviceToHost, b) == cudaSuccess);
    CHECK(h[0] == 7); /* into pageable memory: the stream is synced, the copy done at return */
    /* a copy from pinned memory reads it when it runs, not at the call */
    pin[0] = 1;
    CHECK(cudaMemcpyAsync(d, pin, sizeof(int), cudaMemcpyHostToDevice, a) == cudaSuccess);
    pin[0] = 2;
    CHECK(cudaEventRecord(e, a) == cudaSuccess && cudaEventQuery(e) == cudaSuccess);
    CHECK(cudaMemcpy(h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 2);
    /* from pageable memory, at the call */
    h[1] = 3;
    CHECK(cudaMemcpyAsync(d, h + 1, sizeof(int), cudaMemcpyHostToDevice, a) == cudaSuccess);
    h[1] = 4;
    CHECK(cudaStreamSynchronize(a) == cudaSuccess);
    CHECK(cudaMemcpy(h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 3);
    /* the legacy stream's own work runs late too: a non-blocking stream does not wait for it */
    cudaStream_t c;
    CHECK(cudaStreamCreate(&c) == cudaSuccess); /* a blocking stream */
    emu_rt_launch(
        "set7", [=] { set7(d, 7); }, dim3(1), dim3(32), 0, a);
    CHECK(cudaStreamSynchronize(a) == cudaSuccess);
    CHECK(cudaMemset(d, 0, 32 * sizeof(int)) == cudaSuccess); /* queued on the legacy stream */
    CHECK(cudaMemcpyAsync(d + 32, d, sizeof(int), cudaMemcpyDeviceToDevice, b) == cudaSuccess);
    CHECK(cudaStreamSynchronize(b) == cudaSuccess);
    CHECK(cudaMemcpy(h, d + 32, 2 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 7); /* b read d before the memset ran; the cudaMemcpy ran it (h[1]: d[33]) */
    CHECK(cudaMemcpy(h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 0);
    /* a blocking stream's work runs after the legacy stream's earlier work */
    emu_rt_launch(
        "set7", [=] { set7(d, 7); }, dim3(1), dim3(32), 0, a);
    CHECK(cudaStreamSynchronize(a) == cudaSuccess);
    CHECK(cudaMemset(d, 0, 32 * sizeof(int)) == cudaSuccess);
    CHECK(cudaMemcpyAsync(d + 32, d, sizeof(int), cudaMemcpyDeviceToDevice, c) == cudaSuccess);
    CHECK(cudaStreamSynchronize(c) == cudaSuccess);
    CHECK(cudaMemcpy(h, d + 32, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 0);
    /* and the legacy stream's after a blocking stream's */
    emu_rt_launch(
        "set7", [=] { set7(d, 5); }, dim3(1), dim3(32), 0, c);
    CHECK(cudaMemcpy(d + 32, d, sizeof(int), cudaMemcpyDeviceToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(h, d + 32, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 5);
    /* a kernel on stream 0 runs late; an event recorded after it orders a non-blocking stream */
    emu_rt_launch(
        "set7", [=] { set7(d, 9); }, dim3(1), dim3(32), 0, nullptr);
    CHECK(cudaMemcpyAsync(d + 32, d, sizeof(int), cudaMemcpyDeviceToDevice, b) == cudaSuccess);
    CHECK(cudaStreamSynchronize(b) == cudaSuccess);
    CHECK(cudaMemcpy(h, d + 32, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 5);
    emu_rt_launch(
        "set7", [=] { set7(d, 11); }, dim3(1), dim3(32), 0, nullptr);
    CHECK(cudaEventRecord(e, nullptr) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
    CHECK(cudaMemcpyAsync(d + 32, d, sizeof(int), cudaMemcpyDeviceToDevice, b) == cudaSuccess);
    CHECK(cudaStreamSynchronize(b) == cudaSuccess);
    CHECK(cudaMemcpy(h, d + 32, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 11);
    printf("  streams: late work unseen without an event, seen with one; pinned copies late; the "
           "legacy stream late, ordered with blocking streams only\n");
    cudaStreamDestroy(c);
    cudaFreeHost(pin);
    cudaEventDestroy(e);
    cudaStreamDestroy(b);
    cudaStreamDestroy(a);
}

/* IPC: a handle of a whole block opens in another process (a forked child here) onto the same
 * memory; not in the exporting process; a pointer inside a block is no handle's. */
static void ipc(void)
{
    int *blk = nullptr, v = 0;
    cudaIpcMemHandle_t h;
    CHECK(cudaMalloc((void **)&blk, 1 << 20) == cudaSuccess);
    CHECK(cudaIpcGetMemHandle(&h, blk) == cudaSuccess);
    void *self = nullptr;
    CHECK(cudaIpcOpenMemHandle(&self, h, cudaIpcMemLazyEnablePeerAccess) ==
          cudaErrorDeviceUninitialized);
    CHECK(cudaGetLastError() == cudaErrorDeviceUninitialized);
    CHECK(emu_aborts("cudaIpcGetMemHandle of a pointer inside a block", [&] {
        cudaIpcMemHandle_t h2;
        cudaIpcGetMemHandle(&h2, blk + 64);
    }));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int *peer = nullptr, x = 42;
        if (cudaIpcOpenMemHandle((void **)&peer, h, cudaIpcMemLazyEnablePeerAccess) !=
                cudaSuccess ||
            cudaMemcpy(peer + 5, &x, sizeof x, cudaMemcpyHostToDevice) != cudaSuccess)
            _exit(1);
        bool freed_wrongly =
            emu_aborts("cudaFree of an opened peer block", [&] { cudaFree(peer); });
        fflush(stdout);
        _exit(cudaIpcCloseMemHandle(peer) == cudaSuccess && freed_wrongly ? 0 : 2);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
          WEXITSTATUS(status) == 0);
    CHECK(cudaMemcpy(&v, blk + 5, sizeof v, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(v == 42);
    printf("  ipc: a peer process wrote through the handle (%d)\n", v);
    CHECK(cudaFree(blk) == cudaSuccess);
}

int main()
{
    int n = 0;
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n >= 1);
    int *d = nullptr;
    CHECK(cudaMalloc((void **)&d, 4096 * sizeof(int)) == cudaSuccess);
    CHECK((uintptr_t)d % 256 == 0);
    /* launches */
    emu_rt_launch("kern", [&] { kern(d); }, dim3(4), dim3(256));
    CHECK(cudaGetLastError() == cudaSuccess);
    emu_rt_launch("kern", [&] { kern(d); }, dim3(2), dim3(2048));
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    emu_rt_launch("kern", [&] { kern(d); }, dim3(1, 70000), dim3(32));
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    emu_rt_launch("kern", [&] { kern(d); }, dim3(1), dim3(32, 1, 65));
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    emu_rt_launch("kern", [&] { kern(d); }, dim3(0), dim3(32));
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    emu_rt_launch("kern", [&] { kern(d); }, dim3(1), dim3(32), 64 << 10);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10) ==
          cudaSuccess);
    emu_rt_launch("kern", [&] { kern(d); }, dim3(1), dim3(32), 64 << 10);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess); /* not sticky */
    /* copies */
    static int h[8192];
    CHECK(cudaMemcpy(h, d, 4096 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 1 && h[1023] == 1);
    CHECK(emu_aborts("a copy past the end of a cudaMalloc'd block", [&] {
        cudaMemcpy(d + 1, h, 4096 * sizeof(int), cudaMemcpyHostToDevice);
    }));
    CHECK(emu_aborts("cudaFree of an inner pointer", [&] { cudaFree(d + 1); }));
    /* cuBLAS */
    cublasHandle_t b;
    CHECK(cublasCreate(&b) == CUBLAS_STATUS_SUCCESS);
    float *A, *B, *C, one = 1.0f, zero = 0.0f;
    cudaMalloc((void **)&A, 64 * sizeof(float));
    cudaMalloc((void **)&B, 64 * sizeof(float));
    cudaMalloc((void **)&C, 64 * sizeof(float));
    CHECK(emu_aborts("cublasGemmEx with lda < m", [&] {
        cublasGemmEx(b, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, A, CUDA_R_32F, 4, B, CUDA_R_32F,
                     8, &zero, C, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }));
    CHECK(emu_aborts("cublasGemmEx with B past its buffer", [&] {
        cublasGemmEx(b, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, A, CUDA_R_32F, 8, B + 4,
                     CUDA_R_32F, 8, &zero, C, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
        cudaDeviceSynchronize(); /* checked when it runs, late (the legacy stream's turn) */
    }));
    CHECK(cublasGemmEx(b, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, A, CUDA_R_16BF, 8, B,
                       CUDA_R_16BF, 8, &zero, C, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F_FAST_TF32,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
    /* cuBLASLt: D (8×8) = GELU(A·B + bias), aux = A·B + bias */
    float ha[64], hb[64], hbias[8], hd[64], haux[64];
    for (int i = 0; i < 64; i++)
        ha[i] = (float)((i * 7) % 11 - 5) / 8, hb[i] = (float)((i * 5) % 13 - 6) / 8;
    for (int i = 0; i < 8; i++)
        hbias[i] = (float)i / 10;
    float *bias, *aux;
    cudaMalloc((void **)&bias, 8 * sizeof(float));
    cudaMalloc((void **)&aux, 64 * sizeof(float));
    cudaMemcpy(A, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(B, hb, sizeof hb, cudaMemcpyHostToDevice);
    cudaMemcpy(bias, hbias, sizeof hbias, cudaMemcpyHostToDevice);
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t l8;
    cublasLtMatmulPreference_t pref;
    cublasLtCreate(&lt);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    int64_t ald = 8;
    int32_t bad_ld = 8;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                   sizeof aux);
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &bad_ld,
                                         sizeof bad_ld) == CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ald, sizeof ald);
    cublasLtMatrixLayoutCreate(&l8, CUDA_R_32F, 8, 8, 8);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, l8, l8, l8, l8, pref, 1, &r, &found) ==
              CUBLAS_STATUS_SUCCESS &&
          found == 1);
    CHECK(cublasLtMatmul(lt, desc, &one, A, l8, B, l8, &zero, C, l8, C, l8, &r.algo, nullptr, 0,
                         0) == CUBLAS_STATUS_SUCCESS);
    cudaMemcpy(hd, C, sizeof hd, cudaMemcpyDeviceToHost);
    cudaMemcpy(haux, aux, sizeof haux, cudaMemcpyDeviceToHost);
    double worst = 0;
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 8; i++) {
            double s = hbias[i];
            for (int k = 0; k < 8; k++)
                s += (double)ha[i + 8 * k] * hb[k + 8 * j];
            double g = 0.5 * s * (1 + tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
            worst = std::max(worst, std::max(fabs(haux[i + 8 * j] - s), fabs(hd[i + 8 * j] - g)));
        }
    printf("  cublasLtMatmul GELU_AUX_BIAS: largest error %.2e\n", worst);
    CHECK(worst < 1e-6);
    CHECK(emu_aborts("cublasLtMatmul on a pointer less aligned than the heuristic was told", [&] {
        cublasLtMatrixLayout_t l7;
        cublasLtMatrixLayoutCreate(&l7, CUDA_R_32F, 8, 7, 8);
        epi = CUBLASLT_EPILOGUE_DEFAULT;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        cublasLtMatmulAlgoGetHeuristic(lt, desc, l8, l7, l7, l7, pref, 1, &r, &found);
        cublasLtMatmul(lt, desc, &one, A, l8, B + 1, l7, &zero, C, l7, C, l7, &r.algo, nullptr,
                       0, 0);
    }));
    cublasLtMatrixLayoutDestroy(l8);
    cublasLtMatmulPreferenceDestroy(pref);
    streams(d);
    ipc();
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cublasDestroy(b);
    for (void *p : {(void *)d, (void *)A, (void *)B, (void *)C, (void *)bias, (void *)aux})
        CHECK(cudaFree(p) == cudaSuccess);
    printf(failures ? "gpu_rt_selftest: %d FAILED\n" : "gpu_rt_selftest: all passed\n", failures);
    return failures != 0;
}
