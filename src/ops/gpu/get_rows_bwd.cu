/* get_rows_bwd.cu — the embedding's backward, a scatter-add without float
 * atomics: dtable[ids[t], :] += dout[t, :], repeated ids summed in token
 * order, so the result is deterministic.
 *
 * grb_first_kernel: each token's id goes into an open-addressing hash of
 * P >= 2n slots (the table size is not needed): the slot's key by
 * compare-and-swap, the slot's first token by atomicMin (an order-free
 * result), the token's slot saved.
 * grb_sum_kernel: one block per token; only the first token of an id (the
 * owner) works. It walks the tokens from its own in chunks of one block,
 * compacts the chunk's tokens of the same slot in token order (a ballot per
 * wave, wave offsets in shared memory) and adds their rows into per-thread
 * column sums (GRB_COLS columns per thread, more passes over the tokens
 * for wider rows); the table row gets the sum once. Work O(n x distinct ids
 * / block) compares plus one read of every dout row. */
#include "gpu.h"

#define GRB_THREADS 256
#define GRB_COLS 4 /* columns per thread and pass: 1024 per pass */

static __device__ __forceinline__ uint32_t grb_hash(int32_t id, uint32_t mask) {
    return ((uint32_t)id * 2654435761u) & mask;
}

__global__ void __launch_bounds__(GRB_THREADS)
    grb_first_kernel(const int32_t *__restrict__ ids, int32_t *__restrict__ key, uint32_t *__restrict__ first,
                     uint32_t *__restrict__ slot, int64_t n, uint32_t mask) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
        const int32_t id = ids[t];
        uint32_t h = grb_hash(id, mask);
        for (;;) { /* P >= 2n slots: a free one is always found */
            const int32_t prev = atomicCAS(&key[h], -1, id);
            if (prev == -1 || prev == id) break;
            h = (h + 1) & mask;
        }
        atomicMin(&first[h], (uint32_t)t);
        slot[t] = h;
    }
}

__global__ void __launch_bounds__(GRB_THREADS)
    grb_sum_kernel(const int32_t *__restrict__ ids, const uint32_t *__restrict__ first,
                   const uint32_t *__restrict__ slot, const float *__restrict__ dout, int64_t dout_stride,
                   float *__restrict__ dtable, int64_t n, int64_t dim) {
    __shared__ int32_t list[GRB_THREADS];
    __shared__ int wave_n[GRB_THREADS / 32 + 1];
    constexpr int NW = GRB_THREADS / NSTF_WAVE;
    const int tid = threadIdx.x, lane = tid % NSTF_WAVE, wave = tid / NSTF_WAVE;
    for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
        const uint32_t h = slot[t];
        if (first[h] != (uint32_t)t) continue; /* uniform over the block */
        const int64_t id = ids[t];
        for (int64_t c0 = 0; c0 < dim; c0 += (int64_t)GRB_COLS * GRB_THREADS) {
            float s[GRB_COLS];
#pragma unroll
            for (int c = 0; c < GRB_COLS; c++) s[c] = 0.0f;
            for (int64_t u0 = t; u0 < n; u0 += GRB_THREADS) {
                const int64_t u = u0 + tid;
                const bool m = u < n && slot[u] == h;
                const unsigned long long b = NSTF_BALLOT(m);
                if (lane == 0) wave_n[wave] = __popcll(b);
                __syncthreads();
                int off = 0, total = 0;
                for (int w = 0; w < NW; w++) {
                    off += w < wave ? wave_n[w] : 0;
                    total += wave_n[w];
                }
                if (m) list[off + __popcll(b & ((1ull << lane) - 1ull))] = (int32_t)(u - u0);
                __syncthreads();
                for (int j = 0; j < total; j++) { /* token order */
                    const float *row = dout + (u0 + list[j]) * dout_stride;
#pragma unroll
                    for (int c = 0; c < GRB_COLS; c++) {
                        const int64_t col = c0 + (int64_t)c * GRB_THREADS + tid;
                        if (col < dim) s[c] += row[col];
                    }
                }
                __syncthreads(); /* list and wave_n are rewritten by the next chunk */
            }
#pragma unroll
            for (int c = 0; c < GRB_COLS; c++) {
                const int64_t col = c0 + (int64_t)c * GRB_THREADS + tid;
                if (col < dim) dtable[id * dim + col] += s[c];
            }
        }
    }
}

/* The hash's slots for n tokens: a power of two >= 2n (at least 64). */
static uint64_t grb_slots(int64_t n) {
    uint64_t p = 64;
    while (p < 2 * (uint64_t)n) p *= 2;
    return p;
}

extern "C" size_t nstf_gpu_get_rows_bwd_scratch_bytes(int64_t n_tok) {
    return n_tok < 0 ? 0 : (size_t)(grb_slots(n_tok) * 8 + (uint64_t)n_tok * 4);
}

extern "C" nstf_status nstf_gpu_get_rows_bwd(const int32_t *ids, const float *dout, int64_t dout_stride,
                                             float *dtable, int64_t n_tok, int64_t dim, void *scratch,
                                             size_t scratch_bytes, void *stream) {
    if (!ids || !dout || !dtable || n_tok < 0 || n_tok > INT32_MAX / 4 || dim <= 0 || dout_stride < dim)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_get_rows_bwd: bad arguments (n_tok %lld, dim %lld)",
                              (long long)n_tok, (long long)dim);
    if (n_tok == 0) return NSTF_OK;
    if (!scratch || scratch_bytes < nstf_gpu_get_rows_bwd_scratch_bytes(n_tok))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_get_rows_bwd: scratch of %zu bytes is too small",
                              scratch_bytes);
    gpuStream_t s = (gpuStream_t)stream;
    const uint64_t P = grb_slots(n_tok);
    int32_t *key = (int32_t *)scratch;
    uint32_t *first = (uint32_t *)(key + P), *slot = first + P;
    /* keys -1 (free), first tokens 0xffffffff (none yet): both all ones */
    GPU_CHECK(gpuMemsetAsync(key, 0xff, (size_t)P * 8, s));
    const int64_t blocks = (n_tok + GRB_THREADS - 1) / GRB_THREADS;
    grb_first_kernel<<<(unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID), GRB_THREADS, 0, s>>>(
        ids, key, first, slot, n_tok, (uint32_t)(P - 1));
    GPU_LAUNCH_CHECK(s);
    const unsigned grid = (unsigned)(n_tok < NSTF_GPU_MAX_GRID ? n_tok : NSTF_GPU_MAX_GRID);
    grb_sum_kernel<<<grid, GRB_THREADS, 0, s>>>(ids, first, slot, dout, dout_stride, dtable, n_tok, dim);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
