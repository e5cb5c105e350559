/*
 * The Open MPI side of bench/allreduce.sh: median time per in-place MPI_Allreduce (float32, sum)
 * for each size given on the command line, the same measurement ddpbench makes. Built by the
 * script with Debian's mpicc; not part of the product.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    for (int a = 1; a < argc; a++) {
        size_t bytes = strtoull(argv[a], NULL, 10);
        size_t count = bytes / 4;
        float *buf = malloc(bytes + 64);
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)((rank + i) % 13);
        int iters = (int)((512u << 20) / (bytes + 4096));
        iters = iters < 5 ? 5 : iters > 2000 ? 2000 : iters;
        for (int w = 0; w < 3; w++)
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double *t = malloc(sizeof(double) * (size_t)iters);
        for (int it = 0; it < iters; it++) {
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t[it] = MPI_Wtime() - t0;
        }
        qsort(t, (size_t)iters, sizeof *t, cmp);
        double med = t[iters / 2], worst;
        MPI_Allreduce(&med, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rank == 0)
            printf("mpi,%zu,%.2f\n", bytes, worst * 1e6);
        free(t);
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
