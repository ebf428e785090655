/* rope.cu — rotary position embedding, in place, on q and k (bf16), one
 * thread per rotated pair, and its backward (the rotation by -theta, on
 * the gradients of q and k); NORM rotates (x[2i], x[2i+1]), NEOX (x[i],
 * x[i + d/2]). theta_i = pos * base^(-2i/head_dim) is formed to about
 * double accuracy without double math on the device: the host computes
 * each inverse frequency in double and passes it as a float pair hi + lo
 * (a kernel argument, <= 1 KiB); the product with the integer position is
 * split exactly (fmaf), range-reduced to [-pi, pi] with a two-part 2pi
 * (Cody-Waite), and only then given to the fast hardware sin/cos. At
 * position 10^5 a plain fp32 angle would be off by ~4e-3 rad. Frequency
 * factors (Llama 3.x) divide the pair on the device (nstf_rope_scale), as
 * the fused GEMV's epilogue does. */
#include "gpu.h"
#include "fused_math.h"

#include <math.h>

#define ROPE_THREADS 256
#define ROPE_MAX_PAIRS 128 /* head_dim <= 256 */

struct rope_freqs {
    float hi[ROPE_MAX_PAIRS], lo[ROPE_MAX_PAIRS];
};

__global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(nstf_bf16 *__restrict__ q, int64_t q_stride, nstf_bf16 *__restrict__ k, int64_t k_stride,
            const int32_t *__restrict__ pos, int64_t n_tok, int n_heads, int n_kv_heads, int head_dim,
            const rope_freqs f, const float *__restrict__ factors, int neox, float sgn) {
    const int half = head_dim / 2;
    const int heads = n_heads + n_kv_heads;
    const int64_t n_pairs = n_tok * heads * (int64_t)half;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n_pairs; p += stride) {
        const int i = (int)(p % half);
        const int h = (int)((p / half) % heads);
        const int64_t t = p / ((int64_t)half * heads);
        nstf_bf16 *v = h < n_heads ? q + t * q_stride + (int64_t)h * head_dim
                                   : k + t * k_stride + (int64_t)(h - n_heads) * head_dim;
        float c, sn, hi = f.hi[i], lo = f.lo[i];
        if (factors) nstf_rope_scale(factors[i], &hi, &lo);
        nstf_rope_cs(pos[t], hi, lo, &c, &sn);
        sn *= sgn; /* -1: the transpose (the backward); exact */
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float x0 = nstf_bf16_to_float(v[i0]), x1 = nstf_bf16_to_float(v[i1]);
        float y0, y1;
        nstf_rope_rot(x0, x1, c, sn, &y0, &y1);
        v[i0] = nstf_float_to_bf16(y0);
        v[i1] = nstf_float_to_bf16(y1);
    }
}

extern "C" void nstf_gpu_rope_freqs(float base, int head_dim, float *hi_lo) {
    const int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        const double v = pow((double)base, -2.0 * i / head_dim);
        hi_lo[i] = (float)v;
        hi_lo[half + i] = (float)(v - (double)hi_lo[i]);
    }
}

extern "C" nstf_status nstf_gpu_rope(uint16_t *q, uint16_t *k, const int32_t *pos, int64_t n_tok,
                                     int n_heads, int n_kv_heads, int head_dim, float base,
                                     nstf_rope_mode mode, void *stream) {
    return nstf_gpu_rope_strided(q, (int64_t)n_heads * head_dim, k, (int64_t)n_kv_heads * head_dim, pos, n_tok,
                                 n_heads, n_kv_heads, head_dim, base, NULL, mode, stream);
}

/* sgn 1: rotate by theta (the forward); -1: by -theta (the backward). */
static nstf_status rope_launch(uint16_t *q, int64_t q_stride, uint16_t *k, int64_t k_stride, const int32_t *pos,
                               int64_t n_tok, int n_heads, int n_kv_heads, int head_dim, float base,
                               const float *factors, nstf_rope_mode mode, float sgn, void *stream) {
    if (!q || !pos || n_tok < 0 || n_heads <= 0 || n_kv_heads < 0 || (n_kv_heads > 0 && !k) ||
        head_dim <= 0 || head_dim % 2 || head_dim > 2 * ROPE_MAX_PAIRS || !(base > 0.0f))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_rope: bad arguments (n_tok %lld, heads %d/%d, head_dim %d, base %g)",
                              (long long)n_tok, n_heads, n_kv_heads, head_dim, (double)base);
    if (q_stride < (int64_t)n_heads * head_dim || (n_kv_heads > 0 && k_stride < (int64_t)n_kv_heads * head_dim))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_rope: token strides %lld/%lld below the rows",
                              (long long)q_stride, (long long)k_stride);
    if (mode != NSTF_ROPE_NORM && mode != NSTF_ROPE_NEOX)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_rope: mode %d", (int)mode);
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const int64_t n_pairs = n_tok * (int64_t)(n_heads + n_kv_heads) * (head_dim / 2);
    const int64_t blocks = (n_pairs + ROPE_THREADS - 1) / ROPE_THREADS;
    const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
    rope_freqs f;
    float hl[2 * ROPE_MAX_PAIRS];
    nstf_gpu_rope_freqs(base, head_dim, hl);
    for (int i = 0; i < ROPE_MAX_PAIRS; i++) {
        f.hi[i] = i < head_dim / 2 ? hl[i] : 0.0f;
        f.lo[i] = i < head_dim / 2 ? hl[head_dim / 2 + i] : 0.0f;
    }
    rope_kernel<<<grid, ROPE_THREADS, 0, s>>>((nstf_bf16 *)q, q_stride, (nstf_bf16 *)k, k_stride, pos, n_tok,
                                              n_heads, n_kv_heads, head_dim, f, factors, mode == NSTF_ROPE_NEOX, sgn);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_rope_strided(uint16_t *q, int64_t q_stride, uint16_t *k, int64_t k_stride,
                                             const int32_t *pos, int64_t n_tok, int n_heads, int n_kv_heads,
                                             int head_dim, float base, const float *factors, nstf_rope_mode mode,
                                             void *stream) {
    return rope_launch(q, q_stride, k, k_stride, pos, n_tok, n_heads, n_kv_heads, head_dim, base, factors, mode, 1.0f,
                       stream);
}

extern "C" nstf_status nstf_gpu_rope_bwd(uint16_t *dq, int64_t q_stride, uint16_t *dk, int64_t k_stride,
                                         const int32_t *pos, int64_t n_tok, int n_heads, int n_kv_heads,
                                         int head_dim, float base, nstf_rope_mode mode, void *stream) {
    return rope_launch(dq, q_stride, dk, k_stride, pos, n_tok, n_heads, n_kv_heads, head_dim, base, NULL, mode,
                       -1.0f, stream);
}
