/* head_norm.cu — per-head RMSNorm of q and k in place (Qwen3's q_norm and
 * k_norm, before RoPE): each head row x = bf16(x * rsqrt(mean(x^2) + eps)
 * * w). One wave per head row (head_dim is 64..256: a few elements per
 * lane), the sum of squares in fp32 by a wave reduction; rows are walked
 * grid-stride over (token, head), q's heads first. */
#include "gpu.h"

#define HEAD_NORM_THREADS 256

__global__ void __launch_bounds__(HEAD_NORM_THREADS)
head_norm_kernel(nstf_bf16 *__restrict__ q, int64_t q_stride, nstf_bf16 *__restrict__ k, int64_t k_stride,
                 const float *__restrict__ wq, const float *__restrict__ wk, int64_t n_tok, int n_heads,
                 int n_kv_heads, int head_dim, float eps) {
    const int lane = threadIdx.x % NSTF_WAVE, waves = blockDim.x / NSTF_WAVE;
    const int heads = n_heads + n_kv_heads;
    const int64_t n_rows = n_tok * heads, step = (int64_t)gridDim.x * waves;
    for (int64_t r = (int64_t)blockIdx.x * waves + threadIdx.x / NSTF_WAVE; r < n_rows; r += step) {
        const int64_t t = r / heads;
        const int h = (int)(r - t * heads);
        nstf_bf16 *x = h < n_heads ? q + t * q_stride + (int64_t)h * head_dim
                                   : k + t * k_stride + (int64_t)(h - n_heads) * head_dim;
        const float *w = h < n_heads ? wq : wk;
        float ss = 0.0f;
        for (int i = lane; i < head_dim; i += NSTF_WAVE) {
            const float v = nstf_bf16_to_float(x[i]);
            ss = fmaf(v, v, ss);
        }
        ss = wave_reduce_sum(ss);
        const float rn = nstf_fast_rsqrtf(ss / (float)head_dim + eps);
        for (int i = lane; i < head_dim; i += NSTF_WAVE) x[i] = nstf_float_to_bf16(nstf_bf16_to_float(x[i]) * rn * w[i]);
    }
}

extern "C" nstf_status nstf_gpu_head_norm(uint16_t *q, int64_t q_stride, uint16_t *k, int64_t k_stride,
                                          const float *wq, const float *wk, int64_t n_tok, int n_heads, int n_kv_heads,
                                          int head_dim, float eps, void *stream) {
    if (!q || !wq || n_tok < 0 || n_heads <= 0 || n_kv_heads < 0 || (n_kv_heads > 0 && (!k || !wk)) ||
        head_dim <= 0 || head_dim % 2 || head_dim > 512 || !(eps >= 0.0f) || q_stride < (int64_t)n_heads * head_dim ||
        (n_kv_heads > 0 && k_stride < (int64_t)n_kv_heads * head_dim))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_head_norm: bad arguments (n_tok %lld, heads %d/%d, head_dim %d)",
                              (long long)n_tok, n_heads, n_kv_heads, head_dim);
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const int waves = HEAD_NORM_THREADS / NSTF_WAVE;
    const int64_t rows = n_tok * (n_heads + n_kv_heads), blocks = (rows + waves - 1) / waves;
    const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
    head_norm_kernel<<<grid, HEAD_NORM_THREADS, 0, s>>>((nstf_bf16 *)q, q_stride, (nstf_bf16 *)k, k_stride, wq, wk,
                                                        n_tok, n_heads, n_kv_heads, head_dim, eps);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
