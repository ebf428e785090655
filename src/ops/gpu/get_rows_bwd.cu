/* get_rows_bwd.cu — the embedding's backward, a scatter-add without float
 * atomics: dtable[ids[t], :] += dout[t, :], repeated ids summed in token
 * order, so the result is deterministic.
 *
 * One block per token. A block first looks for an earlier token with the
 * same id; if there is one, that token's block owns the row and this one
 * exits. The owner sums, column by column (threads stride over the row),
 * the rows of every token from its own on that carry the id, in order, and
 * adds the sum into the table row once. O(n^2 / threads) id comparisons:
 * a correct kernel, not a fast one (a sort by id would make it O(n log n)). */
#include "gpu.h"

#define GRB_THREADS 256

__global__ void __launch_bounds__(GRB_THREADS)
    get_rows_bwd_kernel(const int32_t *__restrict__ ids, const float *__restrict__ dout, int64_t dout_stride,
                        float *__restrict__ dtable, int64_t n_tok, int64_t dim) {
    __shared__ int earlier;
    for (int64_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const int32_t id = ids[t];
        if (threadIdx.x == 0) earlier = 0;
        __syncthreads();
        int found = 0;
        for (int64_t u = threadIdx.x; u < t; u += blockDim.x) found |= ids[u] == id;
        if (found) earlier = 1; /* benign race: every writer writes 1 */
        __syncthreads();
        const bool owner = !earlier;
        __syncthreads(); /* `earlier` is reset at the next token */
        if (!owner) continue;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
            float s = 0.0f;
            for (int64_t u = t; u < n_tok; u++)
                if (ids[u] == id) s += dout[u * dout_stride + i];
            dtable[(int64_t)id * dim + i] += s;
        }
    }
}

extern "C" nstf_status nstf_gpu_get_rows_bwd(const int32_t *ids, const float *dout, int64_t dout_stride,
                                             float *dtable, int64_t n_tok, int64_t dim, void *stream) {
    if (!ids || !dout || !dtable || n_tok < 0 || dim <= 0 || dout_stride < dim)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_get_rows_bwd: bad arguments (n_tok %lld, dim %lld)",
                              (long long)n_tok, (long long)dim);
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const unsigned grid = (unsigned)(n_tok < NSTF_GPU_MAX_GRID ? n_tok : NSTF_GPU_MAX_GRID);
    get_rows_bwd_kernel<<<grid, GRB_THREADS, 0, s>>>(ids, dout, dout_stride, dtable, n_tok, dim);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
