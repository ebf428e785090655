/* relayout.cu — weights rewritten, after their upload, into the GPU's row
 * layout (quant.h): the rows of a Q4_0 matrix with a multiple of 256
 * elements split into their scales and their 16-byte runs of codes. In
 * place, one block per row: the row is read whole into shared memory (at
 * most 18 * NSTF_GPU_SPLIT_MAX / 32 = 36 KiB), then written back. */
#include "quant.h"

#define RELAYOUT_THREADS 256

__global__ void __launch_bounds__(RELAYOUT_THREADS)
q4_0_split_kernel(uint8_t *__restrict__ w, size_t row_bytes, int64_t n_rows, int nb) {
    extern __shared__ uint4 relayout_smem[];
    const uint8_t *sm = (const uint8_t *)relayout_smem;
    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        uint8_t *row = w + (size_t)r * row_bytes;
        for (int i = threadIdx.x; i < (int)(row_bytes / 16); i += RELAYOUT_THREADS)
            relayout_smem[i] = ((const uint4 *)row)[i];
        __syncthreads();
        for (int b = threadIdx.x; b < nb; b += RELAYOUT_THREADS) { /* block b: d @ 18 b, qs @ 18 b + 2 */
            const uint16_t *q = (const uint16_t *)(sm + 18 * b + 2);
            ((uint16_t *)row)[b] = *(const uint16_t *)(sm + 18 * b);
            *(uint4 *)(row + 2 * (size_t)nb + 16 * (size_t)b) =
                make_uint4(q[0] | ((uint32_t)q[1] << 16), q[2] | ((uint32_t)q[3] << 16), q[4] | ((uint32_t)q[5] << 16),
                           q[6] | ((uint32_t)q[7] << 16));
        }
        __syncthreads(); /* the row is written before the next is read into the same memory */
    }
}

extern "C" nstf_status nstf_gpu_weights_relayout(nstf_type type, void *w, int64_t n_in, int64_t n_out, void *stream) {
    if (n_in <= 0 || n_out < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_weights_relayout: bad shape (n_in %lld, n_out %lld)",
                              (long long)n_in, (long long)n_out);
    if (type != NSTF_TYPE_Q4_0 || !nstf_q4_0_split(n_in) || n_out == 0) return NSTF_OK; /* the file's layout */
    if (!w || (uintptr_t)w % 16 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_weights_relayout: Q4_0 rows of %lld elements must start 16-byte aligned",
                              (long long)n_in);
    const int nb = (int)(n_in / 32);
    const size_t row_bytes = (size_t)nb * NSTF_Q4_0_BYTES;
    const unsigned grid = (unsigned)(n_out < NSTF_GPU_MAX_GRID ? n_out : NSTF_GPU_MAX_GRID);
    gpuStream_t s = (gpuStream_t)stream;
    GPU_CHECK(nstf_gpu_launch(q4_0_split_kernel, dim3(grid), dim3(RELAYOUT_THREADS), row_bytes, s, false, (uint8_t *)w,
                              row_bytes, n_out, nb));
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
