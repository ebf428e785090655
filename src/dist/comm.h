/* comm.h — the communicator of a tensor-parallel group: one process
 * driving N ranks (one backend each), a host thread per rank.
 *
 * nstf_comm_run() runs a job on every rank at once, each on its own
 * thread (the rank's thread is always the same one: a GPU rank keeps its
 * current device, NCCL sees one thread per communicator), and watches it:
 *  - a rank that fails makes the communicator abort at once, so every
 *    other rank leaves its collective with an error instead of waiting;
 *  - a group that makes no progress (no rank finishes a collective) for
 *    timeout_ms aborts too, and the error names the ranks that were
 *    behind (the fewest collectives done) — a stalled rank is an error
 *    within the stated time, never a hang.
 * An aborted communicator stays aborted: every later call fails.
 *
 * Transports (chosen by the backends' kind, every rank of one kind):
 *  - host memory (CPU backends): the collectives through shared buffers
 *    and barriers; sums are taken in rank order, so every rank gets the
 *    same bits, the result does not depend on thread timing, and a
 *    reduce-scatter's slot holds exactly the all-reduce's values there;
 *  - GPU (CUDA or HIP backends): NCCL (RCCL on HIP), non-blocking
 *    communicators initialised per device in one group, the library loaded
 *    at first use (ops/gpu/ccl.cu), ncclCommAbort on abort. NCCL's
 *    NVLink multicast (NVLS) is kept off (NCCL_NVLS_ENABLE=0 unless set).
 *    Where every pair of GPUs has peer access, all-reduces up to 256 KiB
 *    (a decode step's residual) take the one-shot peer all-reduce of
 *    ops/gpu/p2p_api.h instead: the same bits on every rank (rank-order
 *    sums), capturable in a graph, left on an abort or its own timeout.
 * Used by tensor-parallel inference (model/tp.c) and data-parallel
 * training (model/trainer.c; ZeRO-1's reduce-scatter and all-gather in
 * model/train_update.c). Every collective, whatever its kind, counts as
 * one for the watchdog and for nstf_comm_fault. */
#ifndef NSTF_DIST_COMM_H
#define NSTF_DIST_COMM_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"

#define NSTF_COMM_MAX 16
#define NSTF_COMM_TIMEOUT_MS 30000 /* the default stall timeout */

typedef struct nstf_comm nstf_comm;

/* A communicator over the n backends (not owned; one per rank, all CPU
 * or all GPU, n in 1..NSTF_COMM_MAX). timeout_ms: the stall timeout (0:
 * NSTF_COMM_TIMEOUT_MS). */
nstf_status nstf_comm_create(nstf_backend *const *be, int n, int timeout_ms, nstf_comm **out);
/* Process mode: a communicator of the processes of a launch by mpirun
 * (dist/proc.h, joined already), this process being rank
 * nstf_proc_rank() with backend be (not owned). nstf_comm_run runs the
 * job for this rank only, on the calling thread; collectives take that
 * rank. Host ranks sum in rank order through the launch's
 * all-to-all and all-gather (the same bits as one process driving the
 * same ranks); GPU ranks use NCCL, each process's communicator made with
 * ncclCommInitRank from rank 0's id (no peer one-shot path: it needs
 * every device in one process). A stalled or dead peer makes this rank's
 * collective fail within timeout_ms, naming the ranks behind; the caller
 * then ends the launch (nstf_proc_abort), since the others cannot learn
 * of its error. */
nstf_status nstf_comm_create_proc(nstf_backend *be, int timeout_ms, nstf_comm **out);
void nstf_comm_free(nstf_comm *c);
int nstf_comm_size(const nstf_comm *c);
/* "host" or "NCCL 2.28.9" / "RCCL ...". */
const char *nstf_comm_transport(const nstf_comm *c);

/* Run fn(ctx, rank) on every rank concurrently; returns when all are done
 * (NSTF_OK) or when the job failed: the first failing rank's error, or a
 * stall naming the ranks behind. */
typedef nstf_status (*nstf_comm_job)(void *ctx, int rank);
nstf_status nstf_comm_run(nstf_comm *c, nstf_comm_job fn, void *ctx);

/* In-place sum of buf [n] fp32 in the backend memory of rank `rank`,
 * called by that rank inside a job. On a GPU it is queued on the rank's
 * stream (the result is there for the ops queued after it). */
nstf_status nstf_comm_allreduce(nstf_comm *c, int rank, float *buf, int64_t n);
/* The same, then dst [n] += the sum: in the all-reduce's kernel where the
 * transport can (*added true; buf is then left as it was), else the sum is
 * in buf and the caller adds it (*added false). */
nstf_status nstf_comm_allreduce_add(nstf_comm *c, int rank, float *buf, float *dst, int64_t n, bool *added);

/* ---- sharded collectives (ZeRO-1) ----
 * A buffer of size x shard elements is size slots of `shard` elements,
 * rank r's slot [r shard, (r + 1) shard): the layout of NCCL's in-place
 * reduce-scatter and all-gather, which take one count for every rank. An
 * array of n elements that size does not divide is padded at its end:
 * nstf_comm_shard_len gives the slot length, and the last slots hold the
 * padding (the last rank's real share is the shorter one, possibly empty
 * for tiny arrays). */

/* The slot length for n elements over n_ranks: ceil(n / n_ranks) rounded
 * up to a multiple of align elements (align 64: 256-byte fp32 and
 * 128-byte bf16 slots), so the padded array is n_ranks x *shard >= n
 * elements. Fails on a negative n, a bad count or align, or a padded size
 * past int64. */
nstf_status nstf_comm_shard_len(int64_t n, int n_ranks, int64_t align, int64_t *shard);

/* In-place reduce-scatter of buf [size x shard] fp32 in rank `rank`'s
 * backend memory, called by that rank inside a job: on return its own
 * slot holds the sum over the ranks of that slot; the other slots are
 * undefined. Host: summed in rank order, the same bits the all-reduce
 * gives there. NCCL (ncclReduceScatter, queued on the rank's stream): its
 * own order, the same bits for two ranks (a + b == b + a), within fp32
 * reassociation for more. */
nstf_status nstf_comm_reduce_scatter(nstf_comm *c, int rank, float *buf, int64_t shard);

/* In-place all-gather of buf [size x shard] elements of elem_bytes (1, 2,
 * 4 or 8) in rank `rank`'s backend memory: on return every slot holds its
 * rank's slot, bit for bit (the elements are copied, never computed:
 * NCCL moves them as bytes, so bf16 needs no NCCL type of its own). */
nstf_status nstf_comm_allgather(nstf_comm *c, int rank, void *buf, int64_t shard, int elem_bytes);

/* All-gather of host memory between the rank threads, whatever the
 * transport: all [size x bytes] receives every rank's `bytes` of mine in
 * rank order (mine may be the rank's own place in all). For the small figures every rank must agree on (ZeRO-1's
 * partial sums of the gradient norm): rank threads meet in host memory
 * without a device round trip; processes (process mode) through MPI. */
nstf_status nstf_comm_host_allgather(nstf_comm *c, int rank, const void *mine, void *all, size_t bytes);

/* Whether an all-reduce of n floats can be captured in a graph with the
 * ops around it (the peer one-shot path takes it; NCCL's is not
 * captured, nor are the calls of a group with a planted fault, which the
 * host counts). A replayed call is not counted as progress by the
 * watchdog: a stalled peer then shows as the kernel's own timeout. */
bool nstf_comm_capturable(const nstf_comm *c, int64_t n);

/* Abort (a watchdog, or a caller giving up): every rank's collectives
 * fail from now on. */
void nstf_comm_abort(nstf_comm *c, const char *why);

/* A test's fault: rank `rank` sleeps forever (until abort) when it
 * reaches its collective number `at` (-1: never). */
void nstf_comm_fault(nstf_comm *c, int rank, int64_t at);

#endif
