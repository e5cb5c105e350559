/*
 * stub.c — the MPI set-up functions in a build without MPI (CMake's DDP_MPI off, or no MPI
 * found): they say so, so the core needs no #ifdef around them. The registry (backends.c) then
 * lists no mpi or shm+mpi backend.
 */
#include "group/group_int.h"
#include "util/util.h"

bool ddp__mpi_built(void)
{
    return false;
}

static ddp_status not_built(ddp_error *err)
{
    return ddp__err(err, DDP_ERR_NOT_FOUND,
                    "this ddpc was built without MPI (install libopenmpi-dev and rebuild with "
                    "-DDDP_MPI=ON)");
}

ddp_status ddp__mpi_boot_open(int rank, int world_size, int timeout_ms, ddp__mpi_boot **out,
                              ddp_error *err)
{
    (void)rank, (void)world_size, (void)timeout_ms, (void)out;
    return not_built(err);
}

ddp_status ddp__mpi_boot_allgather(ddp__mpi_boot *b, const void *mine, void *all, size_t len,
                                   ddp_error *err)
{
    (void)b, (void)mine, (void)all, (void)len;
    return not_built(err);
}

ddp_status ddp__mpi_boot_bcast(ddp__mpi_boot *b, const int *ranks, int n, int me, void *buf,
                               size_t len, ddp_error *err)
{
    (void)b, (void)ranks, (void)n, (void)me, (void)buf, (void)len;
    return not_built(err);
}

ddp_status ddp__mpi_boot_barrier(ddp__mpi_boot *b, const int *ranks, int n, int me, ddp_error *err)
{
    (void)b, (void)ranks, (void)n, (void)me;
    return not_built(err);
}

int ddp__mpi_boot_index(const ddp__mpi_boot *b)
{
    (void)b;
    return 0;
}

void ddp__mpi_boot_close(ddp__mpi_boot *b, const char *failed)
{
    (void)b, (void)failed;
}
