/* p2p_api.h — the one-shot all-reduce over peer memory (p2p_allreduce.cu)
 * of the devices one process drives (tensor parallel, dist/comm.c): each
 * rank pushes its buffer into every peer's receive slot over the link,
 * each value in one 8-byte word with the call's tag, waits for the peers'
 * words of this call and sums the n buffers in rank order, so every rank
 * gets the same bits. For the small
 * all-reduces of a decode step (a token's residual, 16 KB on an 8B model),
 * where NCCL's ring pays more in protocol than in bytes. */
#ifndef NSTF_GPU_P2P_API_H
#define NSTF_GPU_P2P_API_H

#include "ops/gpu/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nstf_p2p nstf_p2p;

/* A group over devs[0..n) (n in 2..16, every pair with peer access: peer
 * access is enabled here), taking all-reduces of up to cap floats. */
nstf_status nstf_gpu_p2p_create(const int *devs, int n, int64_t cap, nstf_p2p **out);
void nstf_gpu_p2p_free(nstf_p2p *p);
int64_t nstf_gpu_p2p_cap(const nstf_p2p *p);
/* Rank `rank`'s sum of buf [n] (its device) over the ranks, in place, or
 * with dst non-NULL added into dst [n] instead (dst[i] += sum: the
 * residual add of tensor parallel, buf left as it was); queued on stream.
 * Every rank makes the same calls in the same order. A peer that does not
 * arrive within timeout_ms makes the kernel give up; the rank's next call
 * (or nstf_gpu_p2p_check) reports it. */
nstf_status nstf_gpu_p2p_allreduce_f32(nstf_p2p *p, int rank, float *buf, float *dst, int64_t n, void *stream,
                                       int timeout_ms);
/* The error a rank's earlier all-reduces left (after its stream reached them). */
nstf_status nstf_gpu_p2p_check(nstf_p2p *p, int rank);
/* Every waiting kernel of the group leaves (the communicator aborted). */
void nstf_gpu_p2p_abort(nstf_p2p *p);

#ifdef __cplusplus
}
#endif
#endif
