/* relayout.cu — weights rewritten, after their upload, into the GPU's row
 * layout (quant.h, nstf_gpu_split_rows): the rows of a Q4_0, IQ4_NL or
 * Q8_0 matrix with a multiple of 256 elements split into their scales and
 * their 16-byte aligned runs of codes; a Q6_K row of a multiple of 2048
 * into its super-blocks' codes, scales and d. In place, one block per row:
 * the row is read whole into shared memory (at most
 * NSTF_GPU_SPLIT_MAX_BYTES), then written back. */
#include "quant.h"

#define RELAYOUT_THREADS 256

/* 16 bytes at p (2-byte aligned) as one 16-byte value. */
static __device__ __forceinline__ uint4 rl_ld16_a2(const uint8_t *p) {
    const uint16_t *q = (const uint16_t *)p;
    return make_uint4(q[0] | ((uint32_t)q[1] << 16), q[2] | ((uint32_t)q[3] << 16), q[4] | ((uint32_t)q[5] << 16),
                      q[6] | ((uint32_t)q[7] << 16));
}

/* CB code bytes per block (16: Q4_0 / IQ4_NL, 32: Q8_0), after a 2-byte scale. */
template <int CB>
__global__ void __launch_bounds__(RELAYOUT_THREADS)
split_rows_kernel(uint8_t *__restrict__ w, size_t row_bytes, int64_t n_rows, int nb) {
    extern __shared__ uint4 relayout_smem[];
    const uint8_t *sm = (const uint8_t *)relayout_smem;
    constexpr int BB = CB + 2, NU = CB / 16; /* block bytes; 16-byte units of codes per block */
    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        uint8_t *row = w + (size_t)r * row_bytes;
        for (int i = threadIdx.x; i < (int)(row_bytes / 16); i += RELAYOUT_THREADS)
            relayout_smem[i] = ((const uint4 *)row)[i];
        __syncthreads();
        for (int b = threadIdx.x; b < nb; b += RELAYOUT_THREADS) /* block b: d @ BB b, qs @ BB b + 2 */
            ((uint16_t *)row)[b] = *(const uint16_t *)(sm + BB * b);
        for (int i = threadIdx.x; i < nb * NU; i += RELAYOUT_THREADS) { /* unit u of block b: qs[16 u ..] */
            const int b = i / NU, u = i % NU;
            *(uint4 *)(row + 2 * (size_t)nb + (size_t)CB * b + 16 * u) = rl_ld16_a2(sm + BB * b + 2 + 16 * u);
        }
        __syncthreads(); /* the row is written before the next is read into the same memory */
    }
}

/* Q6_K, nb super-blocks a row (a multiple of 8): codes (ql, qh) of
 * super-block b at 192 b, its scales at 192 nb + 16 b, its d at 208 nb + 2 b. */
__global__ void __launch_bounds__(RELAYOUT_THREADS)
q6k_split_kernel(uint8_t *__restrict__ w, size_t row_bytes, int64_t n_rows, int nb) {
    extern __shared__ uint4 relayout_smem[];
    const uint8_t *sm = (const uint8_t *)relayout_smem;
    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        uint8_t *row = w + (size_t)r * row_bytes;
        for (int i = threadIdx.x; i < (int)(row_bytes / 16); i += RELAYOUT_THREADS)
            relayout_smem[i] = ((const uint4 *)row)[i];
        __syncthreads();
        for (int i = threadIdx.x; i < nb * 12; i += RELAYOUT_THREADS) { /* 12 units of codes a super-block */
            const int b = i / 12, u = i % 12;
            *(uint4 *)(row + 192 * b + 16 * u) = rl_ld16_a2(sm + NSTF_Q6_K_BYTES * b + 16 * u);
        }
        for (int b = threadIdx.x; b < nb; b += RELAYOUT_THREADS) { /* its scales and d */
            *(uint4 *)(row + 192 * nb + 16 * b) = rl_ld16_a2(sm + NSTF_Q6_K_BYTES * b + 192);
            ((uint16_t *)(row + 208 * nb))[b] = *(const uint16_t *)(sm + NSTF_Q6_K_BYTES * b + 208);
        }
        __syncthreads();
    }
}

extern "C" nstf_status nstf_gpu_weights_relayout(nstf_type type, void *w, int64_t n_in, int64_t n_out, void *stream) {
    if (n_in <= 0 || n_out < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_weights_relayout: bad shape (n_in %lld, n_out %lld)",
                              (long long)n_in, (long long)n_out);
    const int cb = nstf_gpu_split_codes((int)type, n_in);
    if (!nstf_gpu_split_rows((int)type, n_in) || n_out == 0) return NSTF_OK; /* the file's layout */
    if (!w || (uintptr_t)w % 16 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_weights_relayout: %s rows of %lld elements must start 16-byte aligned",
                              nstf_type_name(type), (long long)n_in);
    const int nb = (int)(n_in / nstf_q_block_elems((int)type));
    const size_t row_bytes = (size_t)nb * (size_t)nstf_q_block_bytes((int)type);
    const unsigned grid = (unsigned)(n_out < NSTF_GPU_MAX_GRID ? n_out : NSTF_GPU_MAX_GRID);
    gpuStream_t s = (gpuStream_t)stream;
    if (!cb)
        GPU_CHECK(nstf_gpu_launch(q6k_split_kernel, dim3(grid), dim3(RELAYOUT_THREADS), row_bytes, s, false,
                                  (uint8_t *)w, row_bytes, n_out, nb));
    else if (cb == 16)
        GPU_CHECK(nstf_gpu_launch(split_rows_kernel<16>, dim3(grid), dim3(RELAYOUT_THREADS), row_bytes, s, false,
                                  (uint8_t *)w, row_bytes, n_out, nb));
    else
        GPU_CHECK(nstf_gpu_launch(split_rows_kernel<32>, dim3(grid), dim3(RELAYOUT_THREADS), row_bytes, s, false,
                                  (uint8_t *)w, row_bytes, n_out, nb));
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
