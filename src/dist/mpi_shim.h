/* mpi_shim.h — the table of entry points of libnstf_mpi (dist/mpi/shim.c),
 * the small library that holds every MPI call of a launch by mpirun. It is
 * built where MPI is installed and loaded with dlopen at first use
 * (dist/proc.c), so neither libnstf nor the nstf program needs an MPI
 * library to run: only a process that mpirun started loads it.
 *
 * Every call comes from one thread (the process's rank runs on the
 * thread that called it). A collective is polled until done, at most
 * timeout_ms; past that it fails and err names the ranks behind, from
 * the heartbeats every rank sends its peers as it enters a collective
 * (seq, counted by the caller: a rank whose last heartbeat is below seq
 * has not reached it). Return values: 0 done, 1 the timeout, -1 an MPI
 * error (err says which). */
#ifndef NSTF_DIST_MPI_SHIM_H
#define NSTF_DIST_MPI_SHIM_H

#include <stddef.h>
#include <stdint.h>

#define NSTF_MPI_SHIM_VERSION 1
#define NSTF_MPI_SHIM_ENTRY "nstf_mpi_shim_table"

typedef struct nstf_mpi_shim {
    int version; /* NSTF_MPI_SHIM_VERSION */
    /* MPI_Init (once); the rank and size in MPI_COMM_WORLD, and among the
     * ranks of this machine (the GPU a rank takes); desc: "Open MPI
     * v4.1.4" */
    int (*init)(int *rank, int *size, int *local_rank, int *local_size, char *desc, size_t desc_cap, char *err,
                size_t err_cap);
    /* all [size x bytes] receives every rank's `bytes` from mine, in rank
     * order (mine may be this rank's own place in all) */
    int (*allgather)(int64_t seq, const void *mine, void *all, int bytes, int timeout_ms, char *err, size_t err_cap);
    /* rank r receives block r [bytes] of every rank's send [size x bytes]
     * into recv [size x bytes], in rank order */
    int (*alltoall)(int64_t seq, const void *send, void *recv, int bytes, int timeout_ms, char *err, size_t err_cap);
    /* ends every process of the launch (MPI_Abort; it does not return) */
    void (*abort_all)(int code);
    /* MPI_Finalize, after a barrier of at most timeout_ms (a peer that
     * never comes is left) */
    void (*finalize)(int timeout_ms);
} nstf_mpi_shim;

typedef const nstf_mpi_shim *(*nstf_mpi_shim_fn)(void);

#endif
