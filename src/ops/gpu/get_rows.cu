/* get_rows.cu — embedding gather: out[t, :] = dequant(table[ids[t], :]) for
 * tables of any stored type, out F32 (the residual stream) or BF16. The
 * same kernel dequantizes a whole weight matrix to bf16 for the prefill's
 * tile GEMM (ids 0 .. n_out - 1), so it is written for bandwidth: a thread
 * produces 8 consecutive values (quant.h's dq8: the block's scales and the
 * 8 codes read with the widest loads the block alignment allows) and
 * stores them with one 16-byte (bf16) or two 16-byte (f32) stores; the
 * threads of a wave walk consecutive groups of a row. One instance per
 * table type and output type. Float tables whose rows are not a multiple
 * of 8 take a kernel with one value per thread. Values are bit for bit
 * nstf_dequantize_row's (then rounded to bf16 for a BF16 output). */
#include "quant.h"

#define GET_ROWS_THREADS 256

/* One group: 8 values, in range, stored vectorized (vec: out 16-byte aligned). */
template <bool OBF>
static __device__ __forceinline__ void get_rows_store8(void *out, int64_t o, const float (&v)[8], int vec) {
    if (OBF) {
        nstf_bf16 b[8];
#pragma unroll
        for (int k = 0; k < 8; k++) b[k] = nstf_float_to_bf16(v[k]);
        if (vec) {
            uint4 w;
            w.x = (uint32_t)b[0].bits | ((uint32_t)b[1].bits << 16);
            w.y = (uint32_t)b[2].bits | ((uint32_t)b[3].bits << 16);
            w.z = (uint32_t)b[4].bits | ((uint32_t)b[5].bits << 16);
            w.w = (uint32_t)b[6].bits | ((uint32_t)b[7].bits << 16);
            *(uint4 *)((nstf_bf16 *)out + o) = w;
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) ((nstf_bf16 *)out)[o + k] = b[k];
        }
    } else if (vec) {
        *(float4 *)((float *)out + o) = make_float4(v[0], v[1], v[2], v[3]);
        *(float4 *)((float *)out + o + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) ((float *)out)[o + k] = v[k];
    }
}

/* dim % 8 == 0: thread per 8 values; a bad id gives a row of NaN. IDS
 * false (ids NULL): row t, a whole matrix dequantized for the prefill's
 * GEMM, without the id load ahead of the row's loads and the check. */
template <int T, bool OBF, bool IDS>
__global__ void __launch_bounds__(GET_ROWS_THREADS)
get_rows_kernel(const uint8_t *__restrict__ table, size_t row_bytes, int64_t n_rows, const int32_t *__restrict__ ids,
                void *__restrict__ out, int64_t n_tok, int64_t dim, int vec) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    const int64_t groups = dim / 8, total = n_tok * groups;
    const int64_t nbs = nstf_gpu_split_rows(T, dim) ? dim / nstf_q_block_elems(T) : 0; /* quant.h: the GPU's split rows */
    for (int64_t g = (int64_t)blockIdx.x * GET_ROWS_THREADS + threadIdx.x; g < total;
         g += (int64_t)gridDim.x * GET_ROWS_THREADS) {
        const int64_t t = g / groups, i0 = (g - t * groups) * 8;
        float v[8];
        if (!IDS) {
            dq8<T>(table + (size_t)t * row_bytes, i0, v, nbs);
            get_rows_store8<OBF>(out, t * dim + i0, v, vec);
            continue;
        }
        const int32_t id = ids[t];
        if (id >= 0 && id < n_rows) {
            dq8<T>(table + (size_t)id * row_bytes, i0, v, nbs);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = __uint_as_float(0x7fc00000u);
        }
        get_rows_store8<OBF>(out, t * dim + i0, v, vec);
    }
}

/* Float tables with dim % 8 != 0: one value per thread. */
template <int T, bool OBF>
__global__ void __launch_bounds__(GET_ROWS_THREADS)
get_rows_elem_kernel(const uint8_t *__restrict__ table, size_t row_bytes, int64_t n_rows,
                     const int32_t *__restrict__ ids, void *__restrict__ out, int64_t n_tok, int64_t dim, int vec) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    for (int64_t g = (int64_t)blockIdx.x * GET_ROWS_THREADS + threadIdx.x; g < n_tok * dim;
         g += (int64_t)gridDim.x * GET_ROWS_THREADS) {
        const int64_t t = g / dim, i = g - t * dim;
        const int64_t id = ids ? ids[t] : t;
        float v = __uint_as_float(0x7fc00000u);
        if (id >= 0 && id < n_rows) {
            const uint8_t *row = table + (size_t)id * row_bytes;
            if (T == NSTF_TYPE_F32) v = ((const float *)row)[i];
            else if (T == NSTF_TYPE_F16) v = nstf_h2f(((const uint16_t *)row)[i]);
            else v = __uint_as_float((uint32_t)((const uint16_t *)row)[i] << 16);
        }
        if (OBF) ((nstf_bf16 *)out)[g] = nstf_float_to_bf16(v);
        else ((float *)out)[g] = v;
    }
}

typedef void (*get_rows_fn)(const uint8_t *, size_t, int64_t, const int32_t *, void *, int64_t, int64_t, int);

template <bool OBF, bool IDS> static get_rows_fn get_rows_pick(nstf_type t, bool per_elem) {
    if (per_elem) {
        switch (t) {
        case NSTF_TYPE_F32: return get_rows_elem_kernel<NSTF_TYPE_F32, OBF>;
        case NSTF_TYPE_F16: return get_rows_elem_kernel<NSTF_TYPE_F16, OBF>;
        default: return get_rows_elem_kernel<NSTF_TYPE_BF16, OBF>;
        }
    }
    switch (t) {
    case NSTF_TYPE_F32: return get_rows_kernel<NSTF_TYPE_F32, OBF, IDS>;
    case NSTF_TYPE_F16: return get_rows_kernel<NSTF_TYPE_F16, OBF, IDS>;
    case NSTF_TYPE_BF16: return get_rows_kernel<NSTF_TYPE_BF16, OBF, IDS>;
    case NSTF_TYPE_Q8_0: return get_rows_kernel<NSTF_TYPE_Q8_0, OBF, IDS>;
    case NSTF_TYPE_Q4_0: return get_rows_kernel<NSTF_TYPE_Q4_0, OBF, IDS>;
    case NSTF_TYPE_Q4_1: return get_rows_kernel<NSTF_TYPE_Q4_1, OBF, IDS>;
    case NSTF_TYPE_Q5_0: return get_rows_kernel<NSTF_TYPE_Q5_0, OBF, IDS>;
    case NSTF_TYPE_Q5_1: return get_rows_kernel<NSTF_TYPE_Q5_1, OBF, IDS>;
    case NSTF_TYPE_IQ4_NL: return get_rows_kernel<NSTF_TYPE_IQ4_NL, OBF, IDS>;
    case NSTF_TYPE_Q2_K: return get_rows_kernel<NSTF_TYPE_Q2_K, OBF, IDS>;
    case NSTF_TYPE_Q3_K: return get_rows_kernel<NSTF_TYPE_Q3_K, OBF, IDS>;
    case NSTF_TYPE_Q4_K: return get_rows_kernel<NSTF_TYPE_Q4_K, OBF, IDS>;
    case NSTF_TYPE_Q5_K: return get_rows_kernel<NSTF_TYPE_Q5_K, OBF, IDS>;
    case NSTF_TYPE_Q6_K: return get_rows_kernel<NSTF_TYPE_Q6_K, OBF, IDS>;
    case NSTF_TYPE_IQ4_XS: return get_rows_kernel<NSTF_TYPE_IQ4_XS, OBF, IDS>;
    }
    return nullptr;
}

extern "C" nstf_status nstf_gpu_get_rows(nstf_type type, const void *table, int64_t n_rows,
                                         const int32_t *ids, void *out, nstf_type out_type,
                                         int64_t n_tok, int64_t dim, void *stream) {
    if (!table || !out || n_tok < 0 || dim <= 0 || n_rows <= 0 || (!ids && n_tok > n_rows))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_get_rows: bad arguments (n_rows %lld, n_tok %lld, dim %lld)",
                              (long long)n_rows, (long long)n_tok, (long long)dim);
    if (!nstf_type_valid(type))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_get_rows: table type %u", (unsigned)type);
    if (out_type != NSTF_TYPE_F32 && out_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_get_rows: output type %s (F32 or BF16)",
                              nstf_type_name(out_type));
    uint64_t row_bytes = 0;
    if (!nstf_type_row_bytes(type, dim, &row_bytes))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_get_rows: dim %lld is not a whole number of %s blocks",
                              (long long)dim, nstf_type_name(type));
    const int align = nstf_gpu_w_align((int)type, dim);
    if ((uintptr_t)table % (uintptr_t)align != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_get_rows: a %s table of rows of %lld must be %d-byte aligned",
                              nstf_type_name(type), (long long)dim, align);
    if (n_tok == 0) return NSTF_OK;
    const bool obf = out_type == NSTF_TYPE_BF16, per_elem = dim % 8 != 0;
    const int vec = !per_elem && (uintptr_t)out % 16 == 0;
    const get_rows_fn fn = ids ? (obf ? get_rows_pick<true, true>(type, per_elem) : get_rows_pick<false, true>(type, per_elem))
                               : (obf ? get_rows_pick<true, false>(type, per_elem) : get_rows_pick<false, false>(type, per_elem));
    if (!fn) return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_get_rows: table type %s", nstf_type_name(type));
    const int64_t work = per_elem ? n_tok * dim : n_tok * (dim / 8);
    const int64_t blocks = (work + GET_ROWS_THREADS - 1) / GET_ROWS_THREADS;
    /* a whole matrix: at most 32 blocks an SM, each thread looping over
     * groups (5-8% faster than a thread per group on the H200, and 15%
     * over the kernel with the id load: bench/kernels/get_rows/dequant_v1.cu) */
    const int n_sm = nstf_gpu_n_sm();
    const int64_t cap = !ids && n_sm > 0 ? 32 * (int64_t)n_sm : 8 * (int64_t)NSTF_GPU_MAX_GRID;
    const unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
    gpuStream_t s = (gpuStream_t)stream;
    GPU_CHECK(nstf_gpu_launch(fn, dim3(grid), dim3(GET_ROWS_THREADS), 0, s, nstf_gpu_pdl(), (const uint8_t *)table,
                              (size_t)row_bytes, n_rows, ids, out, n_tok, dim, vec));
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
