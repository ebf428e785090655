/* kv_write.cu — KV-cache write for one layer: k_cache[pos[t], :] = k[t, :]
 * and v_cache[pos[t], :] = v[t, :], rows of kv_dim bf16. One block per
 * token; 16-byte copies when rows and pointers allow, else 2-byte. A
 * position outside [0, n_ctx) is skipped (never written out of bounds). */
#include "gpu.h"

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
