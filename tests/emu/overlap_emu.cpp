/*
 * gpu_emu.overlap — a GPU group's collective submitted from the caller's thread waits for the
 * kernels queued on the group's stream BEFORE its submission only, not for those the caller
 * queued after it (the rest of backward, while the progress thread runs the bucket's
 * allreduce): group.c marks the stream at submission (devops' mark), and each GPU backend
 * orders its own stream after that mark. Before, the mark was taken when the progress thread
 * reached the collective, by which time the caller had queued more: on a GPU every bucket but
 * the first waited for all of backward — correct results, no overlap. The emulation runs
 * queued work only when something waits for it, so the collective's wait shows exactly what
 * it was ordered after. World 1, cuda-staged and (where built) nccl, async and queued-blocking.
 */
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ddp/group.h"

#include "selftest_check.h"

static std::atomic<int> later_ran{0};

static void fill(float *x, float v)
{
    x[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

static void one(const char *backend)
{
    ddp_world w;
    memset(&w, 0, sizeof w);
    w.world_size = 1;
    w.local_world_size = 1;
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    go.world = &w;
    go.device = DDP_DEVICE_CUDA;
    go.backend = backend;
    go.timeout_ms = 30000;
    ddp_group *g = nullptr;
    ddp_error err;
    if (ddp_group_init(&go, &g, &err) != DDP_OK) {
        fprintf(stderr, "FAILED: %s group: %s\n", backend, err.msg);
        failures++;
        return;
    }
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    ddp_group_set_stream(g, s);
    const int n = 1024;
    float *x = (float *)ddp_group_alloc(g, n * sizeof(float));
    float *y = (float *)ddp_group_alloc(g, n * sizeof(float));
    CHECK(x && y);
    for (int round = 0; round < 3 && x && y; round++) {
        later_ran = 0;
        /* "backward": this bucket's gradients, then more kernels queued after its submission */
        emu_rt_launch(
            "fill", [=] { fill(x, 2.0f + round); }, dim3(n / 256), dim3(256), 0, s);
        ddp_work *wk = nullptr;
        ddp_status st;
        if (round < 2) {
            st = ddp_allreduce_async(g, x, x, n, DDP_FLOAT32, DDP_SUM, &wk);
        } else {
            /* a blocking call behind a queued one also runs on the progress thread */
            emu_rt_launch(
                "fill_y", [=] { fill(y, 1.0f); }, dim3(n / 256), dim3(256), 0, s);
            ddp_work *first = nullptr;
            CHECK(ddp_allreduce_async(g, y, y, n, DDP_FLOAT32, DDP_SUM, &first) == DDP_OK);
            st = ddp_allreduce_async(g, x, x, n, DDP_FLOAT32, DDP_SUM, &wk);
            CHECK(ddp_work_wait(first) == DDP_OK);
            ddp_work_free(first);
        }
        CHECK(st == DDP_OK);
        emu_rt_launch(
            "later", [] { later_ran = 1; }, dim3(1), dim3(1), 0, s);
        CHECK(ddp_work_wait(wk) == DDP_OK);
        ddp_work_free(wk);
        /* the collective ran without the kernel queued after its submission */
        if (later_ran != 0)
            fprintf(stderr, "%s round %d: the collective waited for later work\n", backend, round);
        CHECK(later_ran == 0);
        float h[n];
        CHECK(cudaStreamSynchronize(s) == cudaSuccess);
        CHECK(later_ran == 1);
        CHECK(cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(h[0] == 2.0f + round && h[n - 1] == 2.0f + round);
    }
    ddp_group_free(g, x);
    ddp_group_free(g, y);
    ddp_group_destroy(g);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    printf("%s: collectives ordered after the work submitted before them only\n", backend);
}

int main(int argc, char **argv)
{
    if (getenv("DDP_EMU_STREAMS")) { /* everything runs at once: nothing to see */
        printf("skipped: DDP_EMU_STREAMS is set\n");
        return 77;
    }
    for (int i = 1; i < argc; i++)
        one(argv[i]);
    return failures ? 1 : 0;
}
