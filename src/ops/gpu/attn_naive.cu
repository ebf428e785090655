/* attn_naive.cu — the unfused kernels of the lower execution levels (L0,
 * L1 in model/llama_gpu.c): attention through a materialized fp32 score
 * matrix (QK^T, scale + causal mask, softmax, PV as separate kernels, or
 * scale + mask + softmax as one), a plain fp32 residual add, and the NVTX
 * range markers. (SwiGLU over rows holding gate | up side by side,
 * nstf_gpu_swiglu_rows, is in swiglu.cu.)
 *
 * Scores are [n_heads, n_tok, n_kv] fp32 (row stride n_kv); token t sits at
 * position pos0 + t and sees cache positions j <= pos0 + t (and, with a
 * sliding window w > 0, j > pos0 + t - w). These kernels
 * are the baseline the flash kernels are measured against: simple, one
 * thread per output, no tiling. */
#include "gpu.h"

/* Profiler ranges: NVTX on CUDA (header-only nvtx3 from the toolkit), roctx
 * on HIP when the build found ROCm's roctracer (cmake/gpu.cmake). */
#if defined(NSTF_GPU_CUDA) && defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define NSTF_HAVE_NVTX 1
#endif
#endif
#if defined(NSTF_GPU_HIP) && defined(NSTF_HAVE_ROCTX)
#include <roctracer/roctx.h>
#endif

#define NAIVE_THREADS 256

static __device__ __forceinline__ float bf16_at(const uint16_t *p, int64_t i) {
    nstf_bf16 b;
    b.bits = p[i];
    return nstf_bf16_to_float(b);
}

/* scores[h, t, j] = q[t, h, :] . k_cache[j, kvh, :] for j < n_kv. */
__global__ void __launch_bounds__(NAIVE_THREADS)
attn_scores_kernel(const uint16_t *__restrict__ q, int64_t q_stride, const uint16_t *__restrict__ kc,
                   float *__restrict__ scores, int64_t n_tok, int64_t n_kv, int n_heads, int n_kv_heads,
                   int head_dim) {
    __shared__ float qs[256];
    const int64_t t = blockIdx.y;
    const int h = blockIdx.z, kvh = h / (n_heads / n_kv_heads);
    const uint16_t *qr = q + t * q_stride + (int64_t)h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = bf16_at(qr, d);
    __syncthreads();
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_kv) return;
    const int64_t kvd = (int64_t)n_kv_heads * head_dim;
    const uint32_t *kr = (const uint32_t *)(kc + j * kvd + (int64_t)kvh * head_dim);
    float acc = 0.0f;
    for (int d2 = 0; d2 < head_dim / 2; d2++) {
        const uint32_t w = kr[d2];
        acc = fmaf(qs[2 * d2], nstf_bf16lo_to_float(w), acc);
        acc = fmaf(qs[2 * d2 + 1], nstf_bf16hi_to_float(w), acc);
    }
    scores[((int64_t)h * n_tok + t) * n_kv + j] = acc;
}

/* The first key position token t sees (0 without a window). */
static __device__ __forceinline__ int64_t window_lo(int64_t pos0, int64_t t, int window) {
    return window > 0 && pos0 + t + 1 > window ? pos0 + t + 1 - window : 0;
}

/* L0: s = scale * s where window_lo <= j <= pos0 + t, else -inf. */
__global__ void __launch_bounds__(NAIVE_THREADS)
scale_mask_kernel(float *__restrict__ s, int64_t n_rows, int64_t n_tok, int64_t n_kv, int64_t pos0, float scale,
                  int window) {
    const int64_t n = n_rows * n_kv, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t row = i / n_kv, j = i - row * n_kv, t = row % n_tok;
        s[i] = j <= pos0 + t && j >= window_lo(pos0, t, window) ? s[i] * scale : -INFINITY;
    }
}

/* One block per row: p = softmax(s). fused: scale and mask applied while
 * reading (L1); otherwise the row is already scaled and masked (L0). */
__global__ void __launch_bounds__(NAIVE_THREADS)
softmax_kernel(float *__restrict__ s, int64_t n_tok, int64_t n_kv, int64_t pos0, float scale, int fused, int window) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x, t = row % n_tok;
    float *r = s + row * n_kv;
    /* fused: entries outside [lo, lim) are masked */
    const int64_t lim = fused ? pos0 + t + 1 : n_kv, lo = fused ? window_lo(pos0, t, window) : 0;
    float m = -INFINITY;
    for (int64_t j = lo + threadIdx.x; j < lim && j < n_kv; j += blockDim.x) m = fmaxf(m, fused ? r[j] * scale : r[j]);
    /* block max through the sum helper's pattern */
    m = wave_reduce_max(m);
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    const int n_waves = (blockDim.x + NSTF_WAVE - 1) / NSTF_WAVE;
    if (lane == 0) red[wave] = m;
    __syncthreads();
    m = lane < n_waves ? red[lane] : -INFINITY;
    m = wave_reduce_max(m);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) {
        float v = fused ? (j < lim && j >= lo ? r[j] * scale : -INFINITY) : r[j];
        float e = v == -INFINITY ? 0.0f : __expf(v - m);
        r[j] = e;
        sum += e;
    }
    sum = block_reduce_sum(sum, red);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) r[j] *= inv;
}

/* out[t, h, d] = sum_j p[h, t, j] v_cache[j, kvh, d]; one block per (t, h),
 * blockDim / head_dim groups of threads split j, summed in shared memory. */
__global__ void __launch_bounds__(NAIVE_THREADS)
attn_pv_kernel(const float *__restrict__ p, const uint16_t *__restrict__ vc, uint16_t *__restrict__ out,
               int64_t out_stride, int64_t n_tok, int64_t n_kv, int n_heads, int n_kv_heads, int head_dim) {
    __shared__ float part[NAIVE_THREADS];
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y, kvh = h / (n_heads / n_kv_heads);
    const int groups = blockDim.x / head_dim, g = threadIdx.x / head_dim, d = threadIdx.x % head_dim;
    const float *pr = p + ((int64_t)h * n_tok + t) * n_kv;
    const int64_t kvd = (int64_t)n_kv_heads * head_dim;
    const uint16_t *vr = vc + (int64_t)kvh * head_dim + d;
    float acc = 0.0f;
    if (g < groups)
        for (int64_t j = g; j < n_kv; j += groups) {
            const float w = pr[j];
            if (w != 0.0f) acc = fmaf(w, bf16_at(vr, j * kvd), acc);
        }
    part[threadIdx.x] = acc;
    __syncthreads();
    if ((int)threadIdx.x < head_dim) {
        float s = 0.0f;
        for (int k = 0; k < groups; k++) s += part[k * head_dim + threadIdx.x];
        out[t * out_stride + (int64_t)h * head_dim + threadIdx.x] = nstf_float_to_bf16(s).bits;
    }
}

__global__ void __launch_bounds__(NAIVE_THREADS)
add_kernel(float *__restrict__ x, const float *__restrict__ y, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] += y[i];
}

static unsigned grid_for(int64_t work) {
    int64_t b = (work + NAIVE_THREADS - 1) / NAIVE_THREADS;
    if (b < 1) b = 1;
    return (unsigned)(b < NSTF_GPU_MAX_GRID ? b : NSTF_GPU_MAX_GRID);
}

static bool heads_ok(int n_heads, int n_kv_heads, int head_dim) {
    return n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && head_dim >= 2 && head_dim % 2 == 0 &&
           head_dim <= 256 && NAIVE_THREADS % head_dim == 0;
}

extern "C" nstf_status nstf_gpu_attn_scores(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                                            float *scores, int64_t n_tok, int64_t n_kv, int n_heads,
                                            int n_kv_heads, int head_dim, void *stream) {
    if (!q || !k_cache || !scores || n_tok < 1 || n_kv < 1 || n_tok > 65535 || n_heads > 65535 ||
        !heads_ok(n_heads, n_kv_heads, head_dim) || ((uintptr_t)k_cache % 4) != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_attn_scores: bad arguments (n_tok %lld, n_kv %lld)",
                              (long long)n_tok, (long long)n_kv);
    gpuStream_t s = (gpuStream_t)stream;
    dim3 grid((unsigned)((n_kv + NAIVE_THREADS - 1) / NAIVE_THREADS), (unsigned)n_tok, (unsigned)n_heads);
    attn_scores_kernel<<<grid, NAIVE_THREADS, 0, s>>>(q, q_stride, k_cache, scores, n_tok, n_kv, n_heads,
                                                      n_kv_heads, head_dim);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_scale_mask(float *scores, int64_t n_heads, int64_t n_tok, int64_t n_kv,
                                           int64_t pos0, float scale, int window, void *stream) {
    if (!scores || n_heads < 1 || n_tok < 1 || n_kv < 1 || pos0 < 0 || window < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_scale_mask: bad arguments");
    gpuStream_t s = (gpuStream_t)stream;
    scale_mask_kernel<<<grid_for(n_heads * n_tok * n_kv), NAIVE_THREADS, 0, s>>>(scores, n_heads * n_tok, n_tok,
                                                                                  n_kv, pos0, scale, window);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_softmax_rows(float *scores, int64_t n_heads, int64_t n_tok, int64_t n_kv,
                                             int64_t pos0, float scale, int fused, int window, void *stream) {
    if (!scores || n_heads < 1 || n_tok < 1 || n_kv < 1 || pos0 < 0 || window < 0 || n_heads * n_tok > 0x7fffffff)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_softmax_rows: bad arguments");
    gpuStream_t s = (gpuStream_t)stream;
    softmax_kernel<<<(unsigned)(n_heads * n_tok), NAIVE_THREADS, 0, s>>>(scores, n_tok, n_kv, pos0, scale, fused,
                                                                           window);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_attn_pv(const float *p, const uint16_t *v_cache, uint16_t *out, int64_t out_stride,
                                        int64_t n_tok, int64_t n_kv, int n_heads, int n_kv_heads, int head_dim,
                                        void *stream) {
    if (!p || !v_cache || !out || n_tok < 1 || n_kv < 1 || n_heads > 65535 || !heads_ok(n_heads, n_kv_heads, head_dim))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_attn_pv: bad arguments");
    gpuStream_t s = (gpuStream_t)stream;
    dim3 grid((unsigned)n_tok, (unsigned)n_heads);
    attn_pv_kernel<<<grid, NAIVE_THREADS, 0, s>>>(p, v_cache, out, out_stride, n_tok, n_kv, n_heads, n_kv_heads,
                                                  head_dim);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_add(float *x, const float *y, int64_t n, void *stream) {
    if (!x || !y || n < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_add: bad arguments");
    if (n == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    add_kernel<<<grid_for(n), NAIVE_THREADS, 0, s>>>(x, y, n);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

extern "C" void nstf_gpu_range_push(const char *name) {
#if defined(NSTF_HAVE_NVTX)
    nvtxRangePushA(name);
#elif defined(NSTF_GPU_HIP) && defined(NSTF_HAVE_ROCTX)
    roctxRangePushA(name);
#else
    (void)name;
#endif
}

extern "C" void nstf_gpu_range_pop(void) {
#if defined(NSTF_HAVE_NVTX)
    nvtxRangePop();
#elif defined(NSTF_GPU_HIP) && defined(NSTF_HAVE_ROCTX)
    roctxRangePop();
#endif
}

extern "C" int nstf_gpu_have_ranges(void) {
#if defined(NSTF_HAVE_NVTX) || (defined(NSTF_GPU_HIP) && defined(NSTF_HAVE_ROCTX))
    return 1;
#else
    return 0;
#endif
}
