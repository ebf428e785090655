/* cross_entropy.cu — the loss of the logits z = h W^T, fused with the
 * logits matmul and chunked over the vocabulary, with its gradients
 * (nstf_ref_cross_entropy's contract): no [n_tok, n_vocab] tensor exists,
 * only one chunk of Vc logits per token at a time.
 *
 *   pass 1, per chunk: Z = h W_c^T (fp32, nstf_gpu_gemm_bf16); per row the
 *     running max m and sum s = sum e^(z - m) (ce_lse_kernel), and the
 *     target's logit when the chunk holds it;
 *   ce_finish_kernel: lse = m + log s per row; the loss, summed over rows in
 *     a fixed order (deterministic), in double;
 *   pass 2, per chunk: Z recomputed (the same call: the same bits), turned
 *     into G = (e^(z - m) / s - onehot) / n_norm (bf16, ce_grad_kernel), then
 *     dh += G W_c and dW_c += G^T h (nstf_gpu_gemm_ex, fp32 accumulation).
 * Ignored targets give zero rows. The chunk width comes from the scratch
 * the caller gives (nstf_gpu_cross_entropy_scratch_bytes). */
#include "gpu.h"

#define CE_THREADS 256
#define CE_LOG2E 1.4426950408889634f

static __device__ __forceinline__ float ce_block_max(float v, float *red) {
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    const int n_waves = (blockDim.x + NSTF_WAVE - 1) / NSTF_WAVE;
    v = wave_reduce_max(v);
    __syncthreads();
    if (lane == 0) red[wave] = v;
    __syncthreads();
    v = lane < n_waves ? red[lane] : -__builtin_huge_valf();
    return wave_reduce_max(v);
}

__global__ void __launch_bounds__(CE_THREADS) ce_init_kernel(float *m, float *s, float *zt, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += step) {
        m[r] = -__builtin_huge_valf();
        s[r] = 0.0f;
        zt[r] = 0.0f;
    }
}

/* one block per row: fold the chunk's logits into (m, s) */
__global__ void __launch_bounds__(CE_THREADS)
    ce_lse_kernel(const float *__restrict__ z, int64_t nv, int64_t v0, const int32_t *__restrict__ targets,
                  int32_t ignore, float *m, float *s, float *zt, int64_t n) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const int32_t tg = targets[r];
        if (tg == ignore) continue; /* the whole block skips the row */
        const float *zr = z + r * nv;
        float cm = -__builtin_huge_valf();
        for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) cm = fmaxf(cm, zr[j]);
        cm = ce_block_max(cm, red);
        const float m_old = m[r], m_new = fmaxf(m_old, cm);
        float e = 0.0f;
        for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) e += nstf_fast_exp2f((zr[j] - m_new) * CE_LOG2E);
        e = block_reduce_sum(e, red);
        if (threadIdx.x == 0) {
            /* m_old = -inf on the first chunk: its sum is 0 and is not rescaled */
            const float keep = m_old == -__builtin_huge_valf() ? 0.0f : nstf_fast_exp2f((m_old - m_new) * CE_LOG2E);
            s[r] = s[r] * keep + e;
            m[r] = m_new;
            if (tg >= v0 && tg < v0 + nv) zt[r] = zr[tg - v0];
        }
        __syncthreads();
    }
}

/* G = (e^(z - m) / s - onehot) / n_norm, bf16 */
__global__ void __launch_bounds__(CE_THREADS)
    ce_grad_kernel(const float *__restrict__ z, int64_t nv, int64_t v0, const int32_t *__restrict__ targets,
                   int32_t ignore, const float *__restrict__ m, const float *__restrict__ s, float inv,
                   nstf_bf16 *__restrict__ g, int64_t n) {
    const int64_t total = n * nv, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t r = i / nv, j = i % nv;
        const int32_t tg = targets[r];
        float v = 0.0f;
        if (tg != ignore) {
            v = nstf_fast_exp2f((z[i] - m[r]) * CE_LOG2E) / s[r] * inv;
            if (v0 + j == tg) v -= inv;
        }
        g[i] = nstf_float_to_bf16(v);
    }
}

/* lse per row and the loss sum over rows in a fixed order, in double: one
 * block; thread i sums rows i, i + 256, ..., then thread 0 the threads in order */
__global__ void __launch_bounds__(CE_THREADS)
    ce_finish_kernel(const float *__restrict__ m, const float *__restrict__ s, const float *__restrict__ zt,
                     const int32_t *__restrict__ targets, int32_t ignore, double inv, float *lse, double *loss,
                     int64_t n) {
    __shared__ double part[CE_THREADS];
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
        const bool on = targets[r] != ignore;
        const float l = on ? m[r] + nstf_fast_log2f(s[r]) * 0.6931471805599453f : 0.0f;
        if (lse) lse[r] = l;
        if (on) acc += ((double)l - (double)zt[r]) * inv;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int i = 0; i < (int)blockDim.x; i++) t += part[i];
        *loss = t;
    }
}

/* ---------------------------------------------------------------- host ---- */

#define CE_ALIGN 256

static size_t ce_round(size_t b) { return (b + CE_ALIGN - 1) / CE_ALIGN * CE_ALIGN; }

extern "C" size_t nstf_gpu_cross_entropy_scratch_bytes(int64_t n_tok, int64_t chunk) {
    return 3 * ce_round((size_t)n_tok * 4) + ce_round((size_t)n_tok * (size_t)chunk * 4) +
           ce_round((size_t)n_tok * (size_t)chunk * 2);
}

extern "C" nstf_status nstf_gpu_cross_entropy(const uint16_t *h, const uint16_t *w, const int32_t *targets,
                                              int32_t ignore_index, double n_norm, float *lse, float *dh, float *dw,
                                              double *loss, int64_t n_tok, int64_t dim, int64_t n_vocab,
                                              void *scratch, size_t scratch_bytes, void *stream) {
    if (!h || !w || !targets || !dh || !loss || !scratch || n_tok <= 0 || dim <= 0 || n_vocab <= 0 ||
        !(n_norm > 0))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_cross_entropy: bad arguments (n_tok %lld, dim %lld, vocab %lld, n_norm %g)",
                              (long long)n_tok, (long long)dim, (long long)n_vocab, n_norm);
    if (n_vocab % 8 || dim % 8)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "nstf_gpu_cross_entropy: vocabulary %lld and width %lld must be multiples of 8",
                              (long long)n_vocab, (long long)dim);
    /* the widest chunk (a multiple of 8, at most the vocabulary) the scratch holds */
    int64_t vc = n_vocab;
    while (vc > 8 && nstf_gpu_cross_entropy_scratch_bytes(n_tok, vc) > scratch_bytes) vc = (vc / 2 + 7) / 8 * 8;
    if (nstf_gpu_cross_entropy_scratch_bytes(n_tok, vc) > scratch_bytes)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_cross_entropy: scratch of %zu bytes is too small",
                              scratch_bytes);
    gpuStream_t s = (gpuStream_t)stream;
    char *p = (char *)scratch;
    float *m = (float *)p, *sm = (float *)(p + ce_round((size_t)n_tok * 4)),
          *zt = (float *)(p + 2 * ce_round((size_t)n_tok * 4));
    float *z = (float *)(p + 3 * ce_round((size_t)n_tok * 4));
    uint16_t *g = (uint16_t *)((char *)z + ce_round((size_t)n_tok * (size_t)vc * 4));
    const unsigned rows_grid = (unsigned)(n_tok < NSTF_GPU_MAX_GRID ? n_tok : NSTF_GPU_MAX_GRID);
    const int64_t rb = (n_tok + CE_THREADS - 1) / CE_THREADS;
    ce_init_kernel<<<(unsigned)(rb < NSTF_GPU_MAX_GRID ? rb : NSTF_GPU_MAX_GRID), CE_THREADS, 0, s>>>(m, sm, zt,
                                                                                                     n_tok);
    GPU_LAUNCH_CHECK(s);
    NSTF_TRY(nstf_gpu_memset(dh, 0, (size_t)n_tok * (size_t)dim * sizeof(float), stream));
    const double inv = 1.0 / n_norm;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t v0 = 0; v0 < n_vocab; v0 += vc) {
            const int64_t nv = n_vocab - v0 < vc ? n_vocab - v0 : vc;
            const uint16_t *wc = w + v0 * dim;
            NSTF_TRY(nstf_gpu_gemm_bf16(h, wc, z, NSTF_TYPE_F32, NULL, NSTF_TYPE_F32, n_tok, nv, dim,
                                        NSTF_GEMM_EPI_NONE, stream));
            if (pass == 0) {
                ce_lse_kernel<<<rows_grid, CE_THREADS, 0, s>>>(z, nv, v0, targets, ignore_index, m, sm, zt, n_tok);
                GPU_LAUNCH_CHECK(s);
                continue;
            }
            const int64_t eb = (n_tok * nv + CE_THREADS - 1) / CE_THREADS;
            ce_grad_kernel<<<(unsigned)(eb < NSTF_GPU_MAX_GRID ? eb : NSTF_GPU_MAX_GRID), CE_THREADS, 0, s>>>(
                z, nv, v0, targets, ignore_index, m, sm, (float)inv, (nstf_bf16 *)g, n_tok);
            GPU_LAUNCH_CHECK(s);
            NSTF_TRY(nstf_gpu_gemm_ex(g, nv, 0, wc, dim, 1, dh, NSTF_TYPE_F32, dim, n_tok, dim, nv, 1, stream));
            if (dw)
                NSTF_TRY(nstf_gpu_gemm_ex(g, nv, 1, h, dim, 1, dw + v0 * dim, NSTF_TYPE_F32, dim, nv, dim, n_tok, 1,
                                          stream));
        }
        if (pass == 0) {
            ce_finish_kernel<<<1, CE_THREADS, 0, s>>>(m, sm, zt, targets, ignore_index, inv, lse, loss, n_tok);
            GPU_LAUNCH_CHECK(s);
        }
    }
    return NSTF_OK;
}
