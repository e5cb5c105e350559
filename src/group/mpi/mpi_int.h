/*
 * mpi_int.h — what the two files of the MPI backend share (boot.c: joining MPI and set-up
 * without a store; mpi.c: the collectives). Private to src/group/mpi.
 */
#ifndef DDP_GROUP_MPI_INT_H
#define DDP_GROUP_MPI_INT_H

#include <mpi.h>

#include "group/group_int.h"

/* The communicator the library's set-up uses: a duplicate of MPI_COMM_WORLD, errors returned
 * rather than fatal. Owned by the boot. */
MPI_Comm ddp__mpi_boot_comm(const ddp__mpi_boot *b);

/* Waits for *req until deadline_ms (ddp__now_ms() clock), testing it in a loop that yields the
 * core after the first few hundred microseconds. DDP_ERR_TIMEOUT when the deadline passes (the
 * request is then still active: MPI cannot cancel it). */
ddp_status ddp__mpi_poll(MPI_Request *req, int64_t deadline_ms);

/* The text of an MPI error code (MPI_Error_string) into buf. */
void ddp__mpi_errstr(int code, char *buf, size_t cap);

/* A communicator of just the global ranks ranks[0..n) (me is my index), made after a
 * ddp__mpi_boot_barrier among them, so that creating it, a blocking call, finds every member
 * already there. */
ddp_status ddp__mpi_boot_comm_of(ddp__mpi_boot *b, const int *ranks, int n, int me, MPI_Comm *out,
                                 ddp_error *err);

#endif /* DDP_GROUP_MPI_INT_H */
