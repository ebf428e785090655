/* kv_write.cu — KV-cache writes for one layer.
 *
 * nstf_gpu_kv_write: k_cache[pos[t], :] = k[t, :] and v_cache[pos[t], :] =
 * v[t, :], rows of kv_dim bf16. One block per token; 16-byte copies when
 * rows and pointers allow, else 2-byte. A position outside [0, n_ctx) is
 * skipped (never written out of bounds).
 *
 * nstf_gpu_kv_q8_prepare: a prefill chunk over a Q8_0 cache (gpu_api.h):
 * one grid widens the cached rows it will attend to into bf16 rows (8
 * values a thread, flash_q8_to_bf16x8) and quantizes the chunk's own k, v
 * rows into the cache (a block of 32 a thread, flash_write_cache_q8), grid
 * (blocks, n_kv_heads), each part a grid-stride loop. */
#include "gpu.h"
#include "flash_common.h"

#define KV_THREADS 128

template <typename T>
__global__ void __launch_bounds__(KV_THREADS)
kv_write_kernel(const T *__restrict__ k, const T *__restrict__ v, T *__restrict__ kc,
                T *__restrict__ vc, const int32_t *__restrict__ pos, int64_t n_tok, int64_t row,
                int64_t n_ctx) {
    for (int64_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const int32_t p = pos[t];
        if (p < 0 || p >= n_ctx) continue;
        for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
            kc[(int64_t)p * row + i] = k[t * row + i];
            vc[(int64_t)p * row + i] = v[t * row + i];
        }
    }
}

extern "C" nstf_status nstf_gpu_kv_write(const uint16_t *k, const uint16_t *v, uint16_t *k_cache,
                                         uint16_t *v_cache, const int32_t *pos, int64_t n_tok,
                                         int64_t kv_dim, int64_t n_ctx, void *stream) {
    if (!k || !v || !k_cache || !v_cache || !pos || n_tok < 0 || kv_dim <= 0 || n_ctx <= 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_kv_write: bad arguments (n_tok %lld, kv_dim %lld, n_ctx %lld)",
                              (long long)n_tok, (long long)kv_dim, (long long)n_ctx);
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const unsigned grid = (unsigned)(n_tok < NSTF_GPU_MAX_GRID ? n_tok : NSTF_GPU_MAX_GRID);
    const uintptr_t al = (uintptr_t)k | (uintptr_t)v | (uintptr_t)k_cache | (uintptr_t)v_cache;
    if (kv_dim % 8 == 0 && al % 16 == 0)
        kv_write_kernel<uint4><<<grid, KV_THREADS, 0, s>>>((const uint4 *)k, (const uint4 *)v,
                                                           (uint4 *)k_cache, (uint4 *)v_cache, pos,
                                                           n_tok, kv_dim / 8, n_ctx);
    else
        kv_write_kernel<uint16_t><<<grid, KV_THREADS, 0, s>>>(k, v, k_cache, v_cache, pos, n_tok,
                                                              kv_dim, n_ctx);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

#define KVQ_THREADS 256

template <int HD>
__global__ void __launch_bounds__(KVQ_THREADS)
    kv_q8_prepare_kernel(const u16 *__restrict__ k, int64_t k_stride, const u16 *__restrict__ v, int64_t v_stride,
                         uint8_t *kc, uint8_t *vc, int64_t kv_rb, u16 *__restrict__ kb, u16 *__restrict__ vb,
                         int64_t n_tok, int64_t lo, int64_t pos0, int n_kv) {
    constexpr int CH = HD / 8;
    const int hkv = blockIdx.y;
    const int64_t gt = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, gn = (int64_t)gridDim.x * blockDim.x;
    const int64_t nd = (pos0 - lo) * CH; /* chunks of 8 values of one tensor */
    for (int64_t i = gt; i < 2 * nd; i += gn) {
        const bool is_v = i >= nd;
        const int64_t j = is_v ? i - nd : i, p = lo + j / CH;
        const int ch = (int)(j % CH), e = hkv * HD + ch * 8;
        const uint8_t *row = (is_v ? vc : kc) + p * kv_rb;
        const float d = nstf_half_bits_to_float(*(const u16 *)(row + (int64_t)n_kv * HD + (e / 32) * 2));
        *(uint4 *)((is_v ? vb : kb) + (p * n_kv + hkv) * HD + ch * 8) =
            flash_q8_to_bf16x8(*(const uint2 *)(row + e), d);
    }
    flash_write_cache_q8<HD>(kc, vc, kv_rb, k, k_stride, v, v_stride, 0, n_tok, pos0, n_kv, hkv, (int)gt, (int)gn);
}

extern "C" nstf_status nstf_gpu_kv_q8_prepare(const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                              uint8_t *k_cache, uint8_t *v_cache, int64_t kv_rb, uint16_t *k_bf,
                                              uint16_t *v_bf, int64_t n_tok, int64_t lo, int64_t pos0, int64_t n_ctx,
                                              int n_kv_heads, int head_dim, void *stream) {
    if (!k || !v || !k_cache || !v_cache || !k_bf || !v_bf || n_tok < 1 || lo < 0 || lo > pos0 ||
        pos0 + n_tok > n_ctx || n_kv_heads < 1 || n_kv_heads > 65535 || (head_dim != 64 && head_dim != 128) ||
        k_stride < (int64_t)n_kv_heads * head_dim || v_stride < (int64_t)n_kv_heads * head_dim ||
        (k_stride | v_stride) % 8 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_kv_q8_prepare: bad arguments (%lld tokens at %lld from %lld, context %lld, "
                              "%d kv heads of %d)",
                              (long long)n_tok, (long long)pos0, (long long)lo, (long long)n_ctx, n_kv_heads, head_dim);
    NSTF_TRY(flash_check_kv_rb("nstf_gpu_kv_q8_prepare", kv_rb, n_kv_heads, head_dim));
    if (kv_rb == 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_kv_q8_prepare: no Q8_0 row size");
    if (((uintptr_t)k | (uintptr_t)v | (uintptr_t)k_cache | (uintptr_t)v_cache | (uintptr_t)k_bf | (uintptr_t)v_bf) % 16)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_kv_q8_prepare: pointers must be 16-byte aligned");
    const int64_t items = 2 * (pos0 - lo) * (head_dim / 8) + 2 * n_tok * (head_dim / 32);
    int64_t blocks = (items + KVQ_THREADS - 1) / KVQ_THREADS;
    blocks = blocks < 1 ? 1 : blocks > 4096 ? 4096 : blocks;
    gpuStream_t s = (gpuStream_t)stream;
    const dim3 grid((unsigned)blocks, (unsigned)n_kv_heads);
    if (head_dim == 64)
        kv_q8_prepare_kernel<64><<<grid, KVQ_THREADS, 0, s>>>(k, k_stride, v, v_stride, k_cache, v_cache, kv_rb, k_bf,
                                                              v_bf, n_tok, lo, pos0, n_kv_heads);
    else
        kv_q8_prepare_kernel<128><<<grid, KVQ_THREADS, 0, s>>>(k, k_stride, v, v_stride, k_cache, v_cache, kv_rb,
                                                               k_bf, v_bf, n_tok, lo, pos0, n_kv_heads);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
