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
 *  - host memory (CPU backends): an all-reduce through shared buffers and
 *    a barrier; the sum is taken in rank order, so every rank gets the same
 *    bits and the result does not depend on thread timing;
 *  - GPU (CUDA or HIP backends): NCCL (RCCL on HIP), non-blocking
 *    communicators initialised per device in one group, the library loaded
 *    at first use (ops/gpu/ccl.cu), ncclCommAbort on abort. NCCL's
 *    NVLink multicast (NVLS) is kept off (NCCL_NVLS_ENABLE=0 unless set).
 *    Where every pair of GPUs has peer access, all-reduces up to 256 KiB
 *    (a decode step's residual) take the one-shot peer all-reduce of
 *    ops/gpu/p2p_api.h instead: the same bits on every rank (rank-order
 *    sums), capturable in a graph, left on an abort or its own timeout.
 * Used by tensor-parallel inference (model/tp.c) and data-parallel
 * training (model/trainer.c). */
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
