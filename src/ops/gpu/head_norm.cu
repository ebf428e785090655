/* head_norm.cu — per-head RMSNorm of q and k in place (Qwen3's q_norm and
 * k_norm, before RoPE): each head row x = bf16(x * rsqrt(mean(x^2) + eps)
 * * w). One wave per head row (head_dim is 64..256: a few elements per
 * lane), the sum of squares in fp32 by a wave reduction; rows are walked
 * grid-stride over (token, head), q's heads first.
 *
 * Also nstf_gpu_head_norm_rope: one token's norm and RoPE in one kernel,
 * the level-3 decode of Qwen3 after the fused QKV GEMV (gemv_fused.cu).
 * It shares the norm's code (head_rnorm, head_xnorm) with the kernel above
 * and the rotation's (fused_math.h) with rope.cu, so its result is bitwise
 * theirs. */
#include "gpu.h"
#include "fused_math.h"

#define HEAD_NORM_THREADS 256

/* 1 / rms of one head row of head_dim bf16 elements (every lane of the
 * wave calls it; each lane gets the value). */
static __device__ __forceinline__ float head_rnorm(const nstf_bf16 *x, int head_dim, float eps, int lane) {
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += NSTF_WAVE) {
        const float v = nstf_bf16_to_float(x[i]);
        ss = fmaf(v, v, ss);
    }
    ss = wave_reduce_sum(ss);
    return nstf_fast_rsqrtf(ss / (float)head_dim + eps);
}

/* Element i of the normalized row, as stored (bf16). */
static __device__ __forceinline__ nstf_bf16 head_xnorm(const nstf_bf16 *x, const float *w, int i, float rn) {
    return nstf_float_to_bf16(nstf_bf16_to_float(x[i]) * rn * w[i]);
}

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
        const float rn = head_rnorm(x, head_dim, eps, lane);
        for (int i = lane; i < head_dim; i += NSTF_WAVE) x[i] = head_xnorm(x, w, i, rn);
    }
}

/* One wave per head row of one token: the norm's 1 / rms, then lane j
 * takes the pairs j, j + NSTF_WAVE, ... of the rotation, normalizing both
 * elements as head_norm_kernel stores them and rotating as rope_kernel
 * does. A pair's elements were read for the sum by other lanes: those
 * reads fed the wave reduction, so they are done before any lane writes.
 * Launched with PDL in the decode chain: waits before its first read. */
__global__ void __launch_bounds__(HEAD_NORM_THREADS)
head_norm_rope_kernel(nstf_bf16 *__restrict__ q, nstf_bf16 *__restrict__ k, const float *__restrict__ wq,
                      const float *__restrict__ wk, int n_heads, int n_kv_heads, int head_dim, float eps,
                      const int32_t *__restrict__ pos, const float *__restrict__ freqs,
                      const float *__restrict__ factors, int neox) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    const int lane = threadIdx.x % NSTF_WAVE;
    const int h = blockIdx.x * (blockDim.x / NSTF_WAVE) + threadIdx.x / NSTF_WAVE;
    if (h >= n_heads + n_kv_heads) return;
    nstf_bf16 *x = h < n_heads ? q + (int64_t)h * head_dim : k + (int64_t)(h - n_heads) * head_dim;
    const float *w = h < n_heads ? wq : wk;
    const float rn = head_rnorm(x, head_dim, eps, lane);
    const int half = head_dim / 2, p = *pos;
    for (int i = lane; i < half; i += NSTF_WAVE) {
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float x0 = nstf_bf16_to_float(head_xnorm(x, w, i0, rn)), x1 = nstf_bf16_to_float(head_xnorm(x, w, i1, rn));
        float c, sn, hi = freqs[i], lo = freqs[half + i];
        if (factors) nstf_rope_scale(factors[i], &hi, &lo);
        nstf_rope_cs(p, hi, lo, &c, &sn);
        float y0, y1;
        nstf_rope_rot(x0, x1, c, sn, &y0, &y1);
        x[i0] = nstf_float_to_bf16(y0);
        x[i1] = nstf_float_to_bf16(y1);
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

extern "C" nstf_status nstf_gpu_head_norm_rope(uint16_t *q, uint16_t *k, const float *wq, const float *wk, int n_heads,
                                               int n_kv_heads, int head_dim, float eps, const int32_t *pos,
                                               const float *freqs, const float *factors, nstf_rope_mode mode,
                                               void *stream) {
    if (!q || !wq || !pos || !freqs || n_heads <= 0 || n_kv_heads < 0 || (n_kv_heads > 0 && (!k || !wk)) ||
        head_dim <= 0 || head_dim % 2 || head_dim > 256 || !(eps >= 0.0f) ||
        n_heads > INT32_MAX / 2 - n_kv_heads || (mode != NSTF_ROPE_NORM && mode != NSTF_ROPE_NEOX))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_head_norm_rope: bad arguments (heads %d/%d, head_dim %d, mode %d)", n_heads,
                              n_kv_heads, head_dim, (int)mode);
    gpuStream_t s = (gpuStream_t)stream;
    const int waves = HEAD_NORM_THREADS / NSTF_WAVE;
    const unsigned grid = (unsigned)((n_heads + n_kv_heads + waves - 1) / waves);
    GPU_CHECK(nstf_gpu_launch(head_norm_rope_kernel, dim3(grid), dim3(HEAD_NORM_THREADS), 0, s, nstf_gpu_pdl(),
                              (nstf_bf16 *)q, (nstf_bf16 *)k, wq, wk, n_heads, n_kv_heads, head_dim, eps, pos, freqs,
                              factors, mode == NSTF_ROPE_NEOX ? 1 : 0));
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
