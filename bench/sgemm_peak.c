/*
 * sgemm_peak — the rank's peak for MFU: OpenBLAS SGEMM GFLOP/s on GPT-shaped products, as many
 * threads as OPENBLAS_NUM_THREADS says (1 for one thread per rank). Prints the best of several
 * timed rounds for each shape and the median over shapes.
 * usage: sgemm_peak [M N K]...   (default: GPT-2-ish shapes at C = 384 and 768)
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int def[][3] = {{2048, 1152, 384}, {2048, 1536, 384}, {2048, 384, 1536}, {2048, 2304, 768},
                    {2048, 3072, 768}, {2048, 768, 3072}};
    int ns = argc > 1 ? (argc - 1) / 3 : 6;
    double best[64];
    for (int s = 0; s < ns && s < 64; s++) {
        int M = argc > 1 ? atoi(argv[1 + 3 * s]) : def[s][0];
        int N = argc > 1 ? atoi(argv[2 + 3 * s]) : def[s][1];
        int K = argc > 1 ? atoi(argv[3 + 3 * s]) : def[s][2];
        float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N),
              *C = malloc(sizeof(float) * (size_t)M * N);
        for (size_t i = 0; i < (size_t)M * K; i++)
            A[i] = (float)(i % 7) * 0.1f;
        for (size_t i = 0; i < (size_t)K * N; i++)
            B[i] = (float)(i % 5) * 0.1f;
        best[s] = 0;
        for (int r = 0; r < 7; r++) {
            double t0 = now();
            int reps = 3;
            for (int k = 0; k < reps; k++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K,
                            0.0f, C, N);
            double gf = 2.0 * M * N * K * reps / (now() - t0) / 1e9;
            if (gf > best[s])
                best[s] = gf;
        }
        printf("sgemm %d x %d x %d: %.1f GFLOP/s\n", M, N, K, best[s]);
        free(A), free(B), free(C);
    }
    qsort(best, (size_t)ns, sizeof best[0], cmp);
    printf("peak_gflops %.1f\n", ns % 2 ? best[ns / 2] : (best[ns / 2 - 1] + best[ns / 2]) / 2);
    return 0;
}
