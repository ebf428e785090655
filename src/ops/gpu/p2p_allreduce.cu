/* p2p_allreduce.cu — the one-shot all-reduce over peer memory
 * (p2p_api.h) for the ranks of one process.
 *
 * Each device holds a receive area [2][n ranks][cap] of 8-byte words:
 * the value's bits and a tag, the call's number + 1 (two slots, used by
 * alternate calls). Call e on rank r:
 *   1. store (value, e + 1) for every element of its buffer into slot
 *      e % 2, row r, of every peer's area: one 8-byte store each, which
 *      arrives whole, so no fence and no separate flag are needed, and the
 *      link's writes are posted (a push costs no round trip);
 *   2. for every element, wait until each peer's word in its own area
 *      carries the tag e + 1, then sum the values in rank order (its own
 *      for q = r), so every rank computes the same bits.
 * A slot is written again two calls later; by then the peer has read it
 * (a rank at call e has seen every peer's words of call e - 1, written
 * after that peer's call e - 2 ended on its stream), and a word left from
 * call e - 2 carries tag e - 1, never e + 1. The wait gives up after the
 * timeout, or when the group is aborted (a word in host memory every
 * device reads), and leaves an error word (host memory too, so the host
 * reads it without a copy). The call's number lives on the device (read
 * by every block at the start, advanced by the last block to finish), so
 * a captured launch replays correctly: a decode step with its all-reduces
 * is one graph. */
#include "gpu.h"
#include "p2p_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P2P_THREADS 256
#define P2P_BLOCKS 64 /* most blocks of one call (4 elements per thread and more beyond) */
#define P2P_MAX 16

typedef unsigned long long u64;

struct nstf_p2p {
    int n, devs[P2P_MAX];
    int64_t cap;
    u64 *recv[P2P_MAX];      /* device r: [2][n][cap] words: tag << 32 | value bits */
    unsigned *ep[P2P_MAX];   /* device r: {calls done, blocks done in the current one} */
    u64 **peers[P2P_MAX];    /* device r: the n receive areas' addresses (a table in device memory: a
                                kernel parameter array indexed by rank would go to the stack) */
    int *herr;               /* host memory, visible to the devices: [P2P_MAX] error words */
    int *habort;             /* host memory: the group's abort word */
};



__global__ void __launch_bounds__(P2P_THREADS)
    p2p_allreduce_kernel(float *buf, float *dst, int64_t n, int rank, int nr, u64 *const *peers, unsigned *ep, int64_t cap,
                         unsigned long long timeout_ns, int *err, const int *abort_word) {
    const unsigned e = *(volatile unsigned *)&ep[0], tag = e + 1u;
    const size_t slot = (size_t)(e % 2u) * (size_t)nr * (size_t)cap;
    const int64_t stride = (int64_t)gridDim.x * P2P_THREADS;
    /* 1. (value, tag) into every peer's slot */
    for (int64_t i = (int64_t)blockIdx.x * P2P_THREADS + threadIdx.x; i < n; i += stride) {
        const u64 w = (u64)tag << 32 | __float_as_uint(buf[i]);
        for (int q = 0; q < nr; q++)
            if (q != rank) *(volatile u64 *)&peers[q][slot + (size_t)rank * (size_t)cap + i] = w;
    }
    /* 2. each element once every peer's word has arrived, summed in rank order */
    const u64 *mine = peers[rank] + slot;
    const unsigned long long t0 = NSTF_TIMER_NS();
    for (int64_t i = (int64_t)blockIdx.x * P2P_THREADS + threadIdx.x; i < n; i += stride) {
        float s = 0.0f;
        for (int q = 0; q < nr; q++) {
            if (q == rank) {
                s += buf[i];
                continue;
            }
            const volatile u64 *src = (const volatile u64 *)&mine[(size_t)q * (size_t)cap + i];
            u64 w = *src;
            for (unsigned spin = 0; (unsigned)(w >> 32) != tag; spin++) {
                if ((spin & 1023u) == 1023u &&
                    (*(const volatile int *)abort_word || NSTF_TIMER_NS() - t0 > timeout_ns)) {
                    *(volatile int *)err = 1 + q; /* the peer that did not arrive, + 1 */
                    NSTF_FENCE_SYSTEM();
                    return;
                }
                w = *src;
            }
            s += __uint_as_float((unsigned)w);
        }
        if (dst) dst[i] += s;
        else buf[i] = s;
    }
    /* the last block to finish advances the call number (every block has read it) */
    __syncthreads();
    if (threadIdx.x == 0) {
        NSTF_FENCE_GPU();
        if (atomicAdd(&ep[1], 1u) == gridDim.x - 1) {
            ep[1] = 0;
            ep[0] = e + 1u;
            NSTF_FENCE_GPU();
        }
    }
}

extern "C" nstf_status nstf_gpu_p2p_create(const int *devs, int n, int64_t cap, nstf_p2p **out) {
    *out = NULL;
    if (n < 2 || n > P2P_MAX || cap < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "peer all-reduce over %d devices of %lld floats", n, (long long)cap);
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            int acc = 0;
            if (a == b) continue;
            GPU_CHECK(gpuDeviceCanAccessPeer(&acc, devs[a], devs[b]));
            if (!acc)
                return nstf_set_error(NSTF_ERR_UNSUPPORTED, "peer all-reduce: GPU %d cannot access GPU %d", devs[a],
                                      devs[b]);
        }
    nstf_p2p *p = (nstf_p2p *)calloc(1, sizeof *p);
    if (!p) return nstf_set_error(NSTF_ERR_OOM, "peer all-reduce state");
    p->n = n;
    p->cap = cap;
    nstf_status st = NSTF_OK;
    int cur = 0;
    (void)gpuGetDevice(&cur);
    for (int r = 0; r < n && st == NSTF_OK; r++) {
        p->devs[r] = devs[r];
        st = nstf_gpu_set_device(devs[r]);
        for (int q = 0; q < n && st == NSTF_OK; q++)
            if (q != r) st = nstf_gpu_enable_peer(devs[r], devs[q]); /* devs[r] stays current */
        const size_t rb = (size_t)2 * n * (size_t)cap * sizeof(u64);
        if (st == NSTF_OK) st = nstf_gpu_malloc((void **)&p->recv[r], rb);
        if (st == NSTF_OK) st = nstf_gpu_memset(p->recv[r], 0, rb, NULL); /* tag 0: no call */
        if (st == NSTF_OK) st = nstf_gpu_malloc((void **)&p->ep[r], 2 * sizeof(unsigned));
        if (st == NSTF_OK) st = nstf_gpu_malloc((void **)&p->peers[r], (size_t)n * sizeof(u64 *));
        if (st == NSTF_OK) st = nstf_gpu_memset(p->ep[r], 0, 2 * sizeof(unsigned), NULL);
    }
    if (st == NSTF_OK) st = nstf_gpu_host_alloc((void **)&p->herr, P2P_MAX * sizeof(int));
    if (st == NSTF_OK) st = nstf_gpu_host_alloc((void **)&p->habort, sizeof(int));
    if (st == NSTF_OK) {
        memset(p->herr, 0, P2P_MAX * sizeof(int));
        *p->habort = 0;
        for (int r = 0; r < n && st == NSTF_OK; r++) {
            st = nstf_gpu_set_device(devs[r]);
            if (st == NSTF_OK) st = nstf_gpu_memcpy_h2d(p->peers[r], p->recv, (size_t)n * sizeof(u64 *), NULL);
            if (st == NSTF_OK) st = nstf_gpu_stream_sync(NULL);
        }
    }
    (void)gpuSetDevice(cur);
    if (st != NSTF_OK) {
        nstf_gpu_p2p_free(p);
        return st;
    }
    *out = p;
    return NSTF_OK;
}

extern "C" void nstf_gpu_p2p_free(nstf_p2p *p) {
    if (!p) return;
    int cur = 0;
    (void)gpuGetDevice(&cur);
    for (int r = 0; r < p->n; r++) {
        if (gpuSetDevice(p->devs[r]) != gpuSuccess) continue;
        (void)nstf_gpu_free(p->recv[r]);
        (void)nstf_gpu_free(p->ep[r]);
        (void)nstf_gpu_free(p->peers[r]);
    }
    (void)gpuSetDevice(cur);
    nstf_gpu_host_free(p->herr);
    nstf_gpu_host_free(p->habort);
    free(p);
}

extern "C" int64_t nstf_gpu_p2p_cap(const nstf_p2p *p) { return p ? p->cap : 0; }

extern "C" void nstf_gpu_p2p_abort(nstf_p2p *p) {
    if (p && p->habort) __atomic_store_n(p->habort, 1, __ATOMIC_RELEASE);
}

extern "C" nstf_status nstf_gpu_p2p_check(nstf_p2p *p, int rank) {
    if (!p || rank < 0 || rank >= p->n) return nstf_set_error(NSTF_ERR_INVALID_ARG, "peer all-reduce: rank %d", rank);
    const int e = __atomic_load_n(&p->herr[rank], __ATOMIC_ACQUIRE);
    if (!e) return NSTF_OK;
    if (__atomic_load_n(p->habort, __ATOMIC_ACQUIRE))
        return nstf_set_error(NSTF_ERR_GPU, "peer all-reduce on rank %d: the group was aborted", rank);
    return nstf_set_error(NSTF_ERR_GPU, "peer all-reduce on rank %d: rank %d did not arrive within the timeout", rank,
                          e - 1);
}

extern "C" nstf_status nstf_gpu_p2p_allreduce_f32(nstf_p2p *p, int rank, float *buf, float *dst, int64_t n,
                                                  void *stream, int timeout_ms) {
    if (!p || rank < 0 || rank >= p->n || n < 0 || n > p->cap || (n && !buf) || timeout_ms < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "peer all-reduce of %lld floats on rank %d (cap %lld)",
                              (long long)n, rank, p ? (long long)p->cap : 0LL);
    NSTF_TRY(nstf_gpu_p2p_check(p, rank));
    if (n == 0) return NSTF_OK;
    int blocks = (int)((n + P2P_THREADS * 4 - 1) / (P2P_THREADS * 4));
    if (blocks > P2P_BLOCKS) blocks = P2P_BLOCKS;
    gpuStream_t s = (gpuStream_t)stream;
    GPU_CHECK(nstf_gpu_launch(p2p_allreduce_kernel, dim3(blocks), dim3(P2P_THREADS), 0, s, 0, buf, dst, n, rank, p->n,
                              (u64 *const *)p->peers[rank],
                              p->ep[rank], p->cap, (unsigned long long)timeout_ms * 1000000ull, &p->herr[rank],
                              (const int *)p->habort));
    return NSTF_OK;
}
