/* proc.h — the process group of a launch by mpirun: one process per rank
 * (Open MPI's mpirun, or any launcher that sets the PMIx / PMI variables),
 * as opposed to one process driving every rank on its threads (comm.h's
 * nstf_comm_create). MPI is reached through libnstf_mpi (dist/mpi_shim.h),
 * loaded with dlopen at the first join: a program that is never launched
 * so needs no MPI library. Used by the communicator's process mode
 * (nstf_comm_create_proc): bootstrap (the NCCL id), the host collectives
 * of CPU ranks, and the figures every rank must agree on.
 *
 * The group is one per process (MPI's world), joined once and left at
 * exit. Collectives here are called from one thread at a time. */
#ifndef NSTF_DIST_PROC_H
#define NSTF_DIST_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Whether the environment says mpirun (or a PMI launcher) started this
 * process as one of several: OMPI_COMM_WORLD_SIZE or PMI_SIZE above 1
 * (switches of core/switches.h). */
bool nstf_proc_launched(void);

/* Join the launch's group: load libnstf_mpi (NSTF_MPI_LIBRARY names the
 * file; else libnstf_mpi.so beside the program or libnstf, then the
 * loader's path) and MPI_Init. Idempotent. */
nstf_status nstf_proc_join(void);

/* Whether this process joined a group of two or more (and has not left). */
bool nstf_proc_active(void);
int nstf_proc_rank(void);
int nstf_proc_size(void);
/* The rank among those on this machine (the GPU it takes), and their count. */
int nstf_proc_local_rank(void);
int nstf_proc_local_size(void);
/* "Open MPI v4.1.4" */
const char *nstf_proc_transport(void);

/* all [size x bytes] receives every rank's bytes of mine in rank order
 * (mine may be this rank's place in all); any size (cut in pieces MPI's
 * int counts take). An error past timeout_ms names the ranks behind. */
nstf_status nstf_proc_allgather(const void *mine, void *all, size_t bytes, int timeout_ms);
/* buf [bytes]: rank 0's bytes on every rank (the others' replaced),
 * through the all-gather; nothing to do for 0 bytes. */
nstf_status nstf_proc_bcast0(void *buf, size_t bytes, int timeout_ms);
/* recv [size x bytes] receives block `rank` of every rank's send
 * [size x bytes], in rank order (bytes up to INT_MAX). */
nstf_status nstf_proc_alltoall(const void *send, void *recv, size_t bytes, int timeout_ms);

/* End every process of the launch (MPI_Abort) with code: for a rank whose
 * error the others cannot learn (they would wait for it until their
 * timeout). Does not return when the group was joined; the caller exits
 * with its error otherwise. */
void nstf_proc_abort(int code);
/* Leave (a barrier of at most timeout_ms, then MPI_Finalize). */
void nstf_proc_leave(int timeout_ms);

#endif
