/* get_rows.cu — embedding gather: out[t, :] = dequant(table[ids[t], :]) for
 * tables of any stored type, out F32 (the residual stream) or BF16.
 * One block per token (grid-stride over tokens), threads stride over the
 * row; a quantized element reads its block's fp16 scale (cached) and its
 * byte. The gather runs once per token, so simplicity wins over speed. */
#include "gpu.h"

#define GET_ROWS_THREADS 256

static __device__ __forceinline__ float get_rows_elem(nstf_type type, const uint8_t *row, int64_t i) {
    const int64_t b = i / NSTF_GPU_QK;
    const int j = (int)(i % NSTF_GPU_QK);
    switch (type) {
    case NSTF_TYPE_F32: return ((const float *)row)[i];
    case NSTF_TYPE_F16: return nstf_half_bits_to_float(((const uint16_t *)row)[i]);
    case NSTF_TYPE_BF16: return nstf_bf16_to_float(((const nstf_bf16 *)row)[i]);
    case NSTF_TYPE_Q8_0: {
        const uint8_t *blk = row + b * NSTF_Q8_0_BYTES;
        return nstf_half_bits_to_float(*(const uint16_t *)blk) * (float)(int8_t)blk[2 + j];
    }
    case NSTF_TYPE_Q4_0: {
        const uint8_t *blk = row + b * NSTF_Q4_0_BYTES;
        const int q = j < 16 ? (blk[2 + j] & 0xf) : (blk[2 + j - 16] >> 4);
        return nstf_half_bits_to_float(*(const uint16_t *)blk) * (float)(q - 8);
    }
    default: { /* Q4_1 */
        const uint8_t *blk = row + b * NSTF_Q4_1_BYTES;
        const int q = j < 16 ? (blk[4 + j] & 0xf) : (blk[4 + j - 16] >> 4);
        return fmaf(nstf_half_bits_to_float(*(const uint16_t *)blk), (float)q,
                    nstf_half_bits_to_float(*(const uint16_t *)(blk + 2)));
    }
    }
}

__global__ void __launch_bounds__(GET_ROWS_THREADS)
get_rows_kernel(nstf_type type, const uint8_t *__restrict__ table, size_t row_bytes, int64_t n_rows,
                const int32_t *__restrict__ ids, void *__restrict__ out, int out_bf16,
                int64_t n_tok, int64_t dim) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    for (int64_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const int32_t id = ids[t];
        const bool ok = id >= 0 && id < n_rows;
        const uint8_t *row = table + (size_t)(ok ? id : 0) * row_bytes;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
            const float v = ok ? get_rows_elem(type, row, i) : __uint_as_float(0x7fc00000u);
            if (out_bf16) ((nstf_bf16 *)out)[t * dim + i] = nstf_float_to_bf16(v);
            else ((float *)out)[t * dim + i] = v;
        }
    }
}

extern "C" nstf_status nstf_gpu_get_rows(nstf_type type, const void *table, int64_t n_rows,
                                         const int32_t *ids, void *out, nstf_type out_type,
                                         int64_t n_tok, int64_t dim, void *stream) {
    if (!table || !ids || !out || n_tok < 0 || dim <= 0 || n_rows <= 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_get_rows: bad arguments (n_rows %lld, n_tok %lld, dim %lld)",
                              (long long)n_rows, (long long)n_tok, (long long)dim);
    if (type != NSTF_TYPE_F32 && type != NSTF_TYPE_F16 && type != NSTF_TYPE_BF16 && type != NSTF_TYPE_Q8_0 &&
        type != NSTF_TYPE_Q4_0 && type != NSTF_TYPE_Q4_1) /* the types get_rows_elem decodes */
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_get_rows: table type %s", nstf_type_name(type));
    if (out_type != NSTF_TYPE_F32 && out_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_get_rows: output type %s (F32 or BF16)",
                              nstf_type_name(out_type));
    uint64_t row_bytes = 0;
    if (!nstf_type_row_bytes(type, dim, &row_bytes))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_get_rows: dim %lld is not a whole number of %s blocks",
                              (long long)dim, nstf_type_name(type));
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const unsigned grid = (unsigned)(n_tok < NSTF_GPU_MAX_GRID ? n_tok : NSTF_GPU_MAX_GRID);
    GPU_CHECK(nstf_gpu_launch(get_rows_kernel, dim3(grid), dim3(GET_ROWS_THREADS), 0, s, nstf_gpu_pdl(), type,
                              (const uint8_t *)table, (size_t)row_bytes, n_rows, ids, out,
                              (int)(out_type == NSTF_TYPE_BF16), n_tok, dim));
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
