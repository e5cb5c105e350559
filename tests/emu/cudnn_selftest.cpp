/*
 * tests/emu/cudnn_selftest.cpp — gpu_emu.cudnn: the emulated cuDNN (cudnn_emu.cpp) refuses what
 * cuDNN's legacy API refuses and computes what it computes: x/w/y of mixed types (BAD_PARAM),
 * BFLOAT16 with BFLOAT16 compute (NOT_SUPPORTED_DATA_TYPE), an algorithm under a math type its
 * table lacks (NOT_SUPPORTED; an abort when strict), the run-time refusal list, a workspace too
 * small (BAD_PARAM), a buffer past its block (abort); a padded, strided convolution's three
 * directions with alpha and beta against loops, in fp32 and bf16; batchnorm training's running
 * statistics (unbiased variance) and saved 1/std.
 */
#include <cudnn.h>

#include <cmath>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern "C" {
#include "util/half.h"
}

#include "selftest_check.h"


static void *dev(size_t bytes, const void *host)
{
    void *p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess)
        abort();
    if (host)
        cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
    return p;
}

int main()
{
    setenv("DDP_EMU_CUDNN_REFUSE", "fwd:1", 1);
    unsetenv("DDP_EMU_CUDNN_STRICT");
    cudnnHandle_t h;
    CHECK(cudnnCreate(&h) == CUDNN_STATUS_SUCCESS);
    /* x (2, 3, 7, 6), w (4, 3, 3, 2), pad (1, 0), stride (2, 1) */
    const int N = 2, C = 3, H = 7, W = 6, K = 4, R = 3, S = 2;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnCreateTensorDescriptor(&xd);
    cudnnCreateTensorDescriptor(&yd);
    cudnnCreateFilterDescriptor(&wd);
    cudnnCreateConvolutionDescriptor(&cd);
    CHECK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, H, W) == 0);
    CHECK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, K, C, R, S) == 0);
    CHECK(cudnnSetConvolution2dDescriptor(cd, 1, 0, 2, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == 0);
    CHECK(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH) == 0);
    int n, c, P, Q;
    CHECK(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &n, &c, &P, &Q) == 0);
    CHECK(n == N && c == K && P == 4 && Q == 5);
    CHECK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, K, P, Q) == 0);
    const size_t nx = (size_t)N * C * H * W, nw = (size_t)K * C * R * S, ny = (size_t)N * K * P * Q;
    std::vector<float> x(nx), w(nw), dy(ny), y0(ny, 0.5f);
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
    for (size_t i = 0; i < nw; i++)
        w[i] = (float)((i * 11) % 13) / 6.0f - 1.0f;
    for (size_t i = 0; i < ny; i++)
        dy[i] = (float)((i * 5) % 7) / 3.0f - 1.0f;
    /* the loops: y = conv(x, w); dx = convᵀ(dy, w); dw = Σ dy·x */
    std::vector<double> ry(ny, 0), rdx(nx, 0), rdw(nw, 0);
    for (int a = 0; a < N; a++)
        for (int k = 0; k < K; k++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++)
                    for (int cc = 0; cc < C; cc++)
                        for (int r = 0; r < R; r++)
                            for (int s = 0; s < S; s++) {
                                int hh = p * 2 - 1 + r, ww = q + s;
                                if (hh < 0 || hh >= H || ww < 0 || ww >= W)
                                    continue;
                                size_t xi = ((size_t)(a * C + cc) * H + hh) * W + ww,
                                       wi = ((size_t)(k * C + cc) * R + r) * S + s,
                                       yi = ((size_t)(a * K + k) * P + p) * Q + q;
                                ry[yi] += (double)x[xi] * w[wi];
                                rdx[xi] += (double)dy[yi] * w[wi];
                                rdw[wi] += (double)dy[yi] * x[xi];
                            }
    float *X = (float *)dev(nx * 4, x.data()), *Wt = (float *)dev(nw * 4, w.data()),
          *Y = (float *)dev(ny * 4, y0.data()), *DY = (float *)dev(ny * 4, dy.data()),
          *DX = (float *)dev(nx * 4, nullptr), *DW = (float *)dev(nw * 4, nullptr);
    void *ws = dev(1 << 20, nullptr);
    const float two = 2.0f, half = 0.5f, zero = 0.0f, one = 1.0f;
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int got = 0;
    CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 8, &got, perf) == 0);
    CHECK(got >= 4);
    bool fma_only = false, tc_only = false, ns = false, huge = false;
    for (int i = 0; i < got; i++) {
        fma_only |= perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT &&
                    perf[i].mathType == CUDNN_FMA_MATH;
        tc_only |= perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD &&
                   perf[i].mathType == CUDNN_TENSOR_OP_MATH && perf[i].memory > 0;
        ns |= perf[i].status != CUDNN_STATUS_SUCCESS;
        huge |= perf[i].memory > ((size_t)256 << 20);
    }
    CHECK(fma_only && tc_only && ns && huge);
    /* the tensor-op-only algorithm under FMA: NOT_SUPPORTED (strict: abort) */
    size_t need = 0;
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
                                                  &need) == CUDNN_STATUS_NOT_SUPPORTED);
    CHECK(emu_aborts("strict: an algorithm under a math type it lacks", [&] {
        setenv("DDP_EMU_CUDNN_STRICT", "1", 1);
        cudnnConvolutionForward(h, &one, xd, X, wd, Wt, cd, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
                                ws, 1 << 20, &zero, yd, Y);
    }));
    /* the refusal list: algorithm 1 (fwd:1) */
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                                  &need) == 0 &&
          need > 0);
    CHECK(cudnnConvolutionForward(h, &one, xd, X, wd, Wt, cd,
                                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws, 1 << 20,
                                  &zero, yd, Y) == CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
    /* the FMA algorithm: a workspace too small, then y = 2·conv + 0.5·y */
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, &need) == 0 &&
          need > 0);
    CHECK(cudnnConvolutionForward(h, &two, xd, X, wd, Wt, cd, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
                                  ws, need - 1, &half, yd, Y) == CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnConvolutionForward(h, &two, xd, X, wd, Wt, cd, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
                                  ws, need, &half, yd, Y) == 0);
    std::vector<float> out(nx > ny ? nx : ny);
    cudaMemcpy(out.data(), Y, ny * 4, cudaMemcpyDeviceToHost);
    double e = 0;
    for (size_t i = 0; i < ny; i++)
        e = fmax(e, fabs(out[i] - (2.0 * ry[i] + 0.25)));
    printf("  forward (alpha 2, beta 0.5): largest error %.1e\n", e);
    CHECK(e < 1e-5);
    CHECK(cudnnConvolutionBackwardData(h, &one, wd, Wt, yd, DY, cd,
                                       CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, nullptr, 0, &zero, xd,
                                       DX) == 0);
    cudaMemcpy(out.data(), DX, nx * 4, cudaMemcpyDeviceToHost);
    e = 0;
    for (size_t i = 0; i < nx; i++)
        e = fmax(e, fabs(out[i] - rdx[i]));
    printf("  backward data: largest error %.1e\n", e);
    CHECK(e < 1e-5);
    CHECK(cudnnConvolutionBackwardFilter(h, &one, xd, X, yd, DY, cd,
                                         CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, nullptr, 0, &zero,
                                         wd, DW) == 0);
    cudaMemcpy(out.data(), DW, nw * 4, cudaMemcpyDeviceToHost);
    e = 0;
    for (size_t i = 0; i < nw; i++)
        e = fmax(e, fabs(out[i] - rdw[i]));
    printf("  backward filter: largest error %.1e\n", e);
    CHECK(e < 1e-5);
    CHECK(emu_aborts("a y buffer one element short", [&] {
        float *small = (float *)dev((ny - 1) * 4, nullptr);
        cudnnConvolutionForward(h, &one, xd, X, wd, Wt, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                nullptr, 0, &zero, yd, small);
    }));
    /* types: bf16 x with fp32 w and y is BAD_PARAM; all bf16 with bf16 compute NOT_SUPPORTED;
     * all bf16 with fp32 compute (PSEUDO_BFLOAT16) runs, its output rounded to bf16 */
    cudnnTensorDescriptor_t xb, yb;
    cudnnFilterDescriptor_t wb;
    cudnnConvolutionDescriptor_t cb;
    cudnnCreateTensorDescriptor(&xb);
    cudnnCreateTensorDescriptor(&yb);
    cudnnCreateFilterDescriptor(&wb);
    cudnnCreateConvolutionDescriptor(&cb);
    cudnnSetTensor4dDescriptor(xb, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, N, C, H, W);
    cudnnSetTensor4dDescriptor(yb, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, N, K, P, Q);
    cudnnSetFilter4dDescriptor(wb, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NCHW, K, C, R, S);
    cudnnSetConvolution2dDescriptor(cb, 1, 0, 2, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                    CUDNN_DATA_BFLOAT16);
    std::vector<uint16_t> xh(nx), wh(nw);
    for (size_t i = 0; i < nx; i++)
        xh[i] = ddp__f32_to_bf16(x[i]);
    for (size_t i = 0; i < nw; i++)
        wh[i] = ddp__f32_to_bf16(w[i]);
    void *XB = dev(nx * 2, xh.data()), *WB = dev(nw * 2, wh.data()), *YB = dev(ny * 2, nullptr);
    CHECK(cudnnConvolutionForward(h, &one, xb, XB, wd, Wt, cd,
                                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, yd,
                                  Y) == CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnConvolutionForward(h, &one, xb, XB, wb, WB, cb,
                                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, yb,
                                  YB) == CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
    cudnnSetConvolution2dDescriptor(cb, 1, 0, 2, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                    CUDNN_DATA_FLOAT);
    CHECK(cudnnConvolutionForward(h, &one, xb, XB, wb, WB, cb,
                                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, yb,
                                  YB) == 0);
    std::vector<uint16_t> yh(ny);
    cudaMemcpy(yh.data(), YB, ny * 2, cudaMemcpyDeviceToHost);
    e = 0;
    for (size_t i = 0; i < ny; i++)
        e = fmax(e, fabs(ddp__bf16_to_f32(yh[i]) - ry[i]) / fmax(1.0, fabs(ry[i])));
    printf("  PSEUDO_BFLOAT16 forward: largest relative error %.1e (bf16 inputs and output)\n", e);
    CHECK(e < 2e-2);
    /* batchnorm training: running mean and unbiased variance, saved 1/std */
    cudnnTensorDescriptor_t bd;
    cudnnCreateTensorDescriptor(&bd);
    CHECK(cudnnDeriveBNTensorDescriptor(bd, xd, CUDNN_BATCHNORM_SPATIAL) == 0);
    std::vector<float> g(C, 1.5f), b(C, 0.25f), rm(C, 1.0f), rv(C, 2.0f);
    float *G = (float *)dev(C * 4, g.data()), *Bb = (float *)dev(C * 4, b.data()),
          *RM = (float *)dev(C * 4, rm.data()), *RV = (float *)dev(C * 4, rv.data()),
          *SM = (float *)dev(C * 4, nullptr), *SI = (float *)dev(C * 4, nullptr),
          *BY = (float *)dev(nx * 4, nullptr);
    CHECK(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, X,
                                                 xd, BY, bd, G, Bb, 0.1, RM, RV, 1e-5, SM,
                                                 SI) == 0);
    std::vector<float> grm(C), grv(C), gsi(C);
    cudaMemcpy(grm.data(), RM, C * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(grv.data(), RV, C * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(gsi.data(), SI, C * 4, cudaMemcpyDeviceToHost);
    const size_t M = (size_t)N * H * W;
    for (int cc = 0; cc < C; cc++) {
        double s = 0, s2 = 0;
        for (int a = 0; a < N; a++)
            for (int i = 0; i < H * W; i++)
                s += x[(size_t)(a * C + cc) * H * W + i];
        double mean = s / (double)M;
        for (int a = 0; a < N; a++)
            for (int i = 0; i < H * W; i++) {
                double d = x[(size_t)(a * C + cc) * H * W + i] - mean;
                s2 += d * d;
            }
        CHECK(fabs(grm[cc] - (0.9 * 1.0 + 0.1 * mean)) < 1e-6);
        CHECK(fabs(grv[cc] - (0.9 * 2.0 + 0.1 * s2 / (double)(M - 1))) < 1e-6);
        CHECK(fabs(gsi[cc] - 1.0 / sqrt(s2 / (double)M + 1e-5)) < 1e-5 * gsi[cc]);
    }
    CHECK(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_PER_ACTIVATION, &one, &zero,
                                                 xd, X, xd, BY, bd, G, Bb, 0.1, RM, RV, 1e-5, SM,
                                                 SI) == CUDNN_STATUS_NOT_SUPPORTED);
    CHECK(strcmp(cudnnGetErrorString(CUDNN_STATUS_NOT_SUPPORTED_SHAPE),
                 "CUDNN_STATUS_NOT_SUPPORTED_SHAPE") == 0);
    void *bufs[] = {X, Wt, Y, DY, DX, DW, ws, XB, WB, YB, G, Bb, RM, RV, SM, SI, BY};
    for (void *p : bufs)
        cudaFree(p);
    cudnnDestroyTensorDescriptor(bd);
    cudnnDestroyTensorDescriptor(xb);
    cudnnDestroyTensorDescriptor(yb);
    cudnnDestroyFilterDescriptor(wb);
    cudnnDestroyConvolutionDescriptor(cb);
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyConvolutionDescriptor(cd);
    cudnnDestroy(h);
    printf("%s\n", failures ? "gpu_emu.cudnn: FAILED" : "gpu_emu.cudnn: all checks passed");
    return failures ? 1 : 0;
}
