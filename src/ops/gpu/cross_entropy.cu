/* cross_entropy.cu — the loss of the logits z = h W^T, fused with the
 * logits matmul and chunked over the tokens, with its gradients
 * (nstf_ref_cross_entropy's contract): no [n_tok, n_vocab] tensor exists,
 * only the logits of one chunk of tokens at a time, each computed once.
 *
 * Per chunk of `rows` tokens (the last one shorter):
 *   Z = h_c W^T over the whole vocabulary (fp32, nstf_gpu_gemm_bf16);
 *   ce_row_kernel: per row the log-sum-exp in one read of the row (each
 *     thread a running max and sum, merged over the block) and the
 *     target's logit;
 *   ce_grad_kernel: G = (e^(z - lse) - onehot) / n_norm in bf16, in 32 x 32
 *     tiles, also written transposed (G^T) when the weight gradient takes
 *     the transposing path below;
 *   dh_c = G W: on Hopper the wgmma GEMM on k-major operands (W^T made
 *     once per call);
 *   dW += G^T h_c: on Hopper the wgmma weight gradient on G and h_c as
 *     stored (nstf_gpu_gemm_dw), or where it needs a split, the wgmma GEMM
 *     on G^T and h_c^T with the residual epilogue adding into dW;
 *   elsewhere, or for a shape the wgmma paths do not take, the portable
 *   nstf_gpu_gemm_ex on the operands as stored (ce_plan says which).
 * ce_finish_kernel sums the loss over all rows in a fixed order, in double
 * (deterministic). Ignored targets give zero rows and no loss. The chunk is
 * the caller's (nstf_gpu_cross_entropy_rows): thousands of rows, so the
 * input gradient's GEMM (rows x dim outputs over K = the vocabulary) has
 * tiles for every SM. */
#include "gpu.h"

#define CE_THREADS 256
#define CE_LOG2E 1.4426950408889634f

typedef unsigned short u16;

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

/* One block per row of the chunk's logits z [n, nv] (nv % 4 == 0, rows
 * 16-byte aligned): lse[r] and the target's logit zt[r]; 0 and 0 for an
 * ignored row. */
__global__ void __launch_bounds__(CE_THREADS)
    ce_row_kernel(const float *__restrict__ z, int64_t nv, const int32_t *__restrict__ targets, int32_t ignore,
                  float *__restrict__ lse, float *__restrict__ zt, int64_t n) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const int32_t tg = targets[r];
        if (tg == ignore) { /* the whole block skips the row */
            if (threadIdx.x == 0) lse[r] = 0.0f, zt[r] = 0.0f;
            continue;
        }
        const float4 *zr = (const float4 *)(z + r * nv);
        float m = -__builtin_huge_valf(), s = 0.0f;
        for (int64_t j = threadIdx.x; j < nv / 4; j += blockDim.x) {
            const float4 x = zr[j];
            const float mx = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
            if (mx > m) { /* from -inf: s is 0 and stays 0 */
                s *= nstf_fast_exp2f((m - mx) * CE_LOG2E);
                m = mx;
            }
            s += nstf_fast_exp2f((x.x - m) * CE_LOG2E) + nstf_fast_exp2f((x.y - m) * CE_LOG2E) +
                 nstf_fast_exp2f((x.z - m) * CE_LOG2E) + nstf_fast_exp2f((x.w - m) * CE_LOG2E);
        }
        const float bm = ce_block_max(m, red);
        const float e = block_reduce_sum(s > 0.0f ? s * nstf_fast_exp2f((m - bm) * CE_LOG2E) : 0.0f, red);
        if (threadIdx.x == 0) {
            lse[r] = bm + nstf_fast_log2f(e) * 0.6931471805599453f;
            zt[r] = tg >= 0 && tg < nv ? z[r * nv + tg] : 0.0f;
        }
    }
}

/* G [n, nv] = (e^(z - lse) - onehot) * inv in bf16, and G^T [nv, n] when gt
 * is not NULL: 32 x 32 tiles through shared memory (33 columns: the
 * transposed reads fall in distinct banks), 8 rows per pass of the 256
 * threads, as transpose_bf16_kernel. */
__global__ void __launch_bounds__(CE_THREADS)
    ce_grad_kernel(const float *__restrict__ z, int64_t nv, const int32_t *__restrict__ targets, int32_t ignore,
                   const float *__restrict__ lse, float inv, u16 *__restrict__ g, u16 *__restrict__ gt, int64_t n) {
    __shared__ u16 t[32][33];
    const int64_t r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (int i = ty; i < 32; i += CE_THREADS / 32) {
        const int64_t r = r0 + i, c = c0 + tx;
        if (r >= n || c >= nv) continue;
        const int32_t tg = targets[r];
        float v = 0.0f;
        if (tg != ignore) {
            v = nstf_fast_exp2f((z[r * nv + c] - lse[r]) * CE_LOG2E) * inv;
            if (c == tg) v -= inv;
        }
        const u16 b = nstf_float_to_bf16(v).bits;
        g[r * nv + c] = b;
        t[i][tx] = b;
    }
    if (!gt) return; /* the same for the whole block */
    __syncthreads();
    for (int i = ty; i < 32; i += CE_THREADS / 32) {
        const int64_t c = c0 + i, r = r0 + tx;
        if (c < nv && r < n) gt[c * n + r] = t[tx][i];
    }
}

/* The loss sum over rows in a fixed order, in double, and lse out: one
 * block; thread i sums rows i, i + 256, ..., then thread 0 the threads in
 * order */
__global__ void __launch_bounds__(CE_THREADS)
    ce_finish_kernel(const float *__restrict__ rl, const float *__restrict__ zt, const int32_t *__restrict__ targets,
                     int32_t ignore, double inv, float *lse, double *loss, int64_t n) {
    __shared__ double part[CE_THREADS];
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
        if (lse) lse[r] = rl[r];
        if (targets[r] != ignore) acc += ((double)rl[r] - (double)zt[r]) * inv;
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

/* How a chunk of nc rows (at hc) computes its gradients: dh on the wgmma
 * GEMM (W^T made once); dW on the wgmma weight gradient reading G and h_c
 * as stored (mn; only without a split: no scratch of its own), else on the
 * wgmma GEMM after transposing (kmajor: G^T from ce_grad_kernel, h_c^T),
 * else the portable GEMM. The chunk's G sits in the scratch, 256-byte
 * aligned, so only hc's alignment matters to the weight gradient. */
typedef struct {
    bool dh_fast, dw_mn, dw_kmajor;
} ce_chunk_plan;

static ce_chunk_plan ce_plan(const uint16_t *hc, bool with_dw, int64_t nc, int64_t dim, int64_t n_vocab) {
    ce_chunk_plan c = {nstf_gpu_gemm_kmajor_fast(nc, dim, n_vocab) != 0, false, false};
    size_t sb = 0;
    c.dw_mn = with_dw && nstf_gpu_gemm_dw_fast(hc, n_vocab, hc, dim, n_vocab, dim, nc, &sb) && sb == 0;
    c.dw_kmajor = with_dw && !c.dw_mn && nstf_gpu_gemm_kmajor_fast(n_vocab, dim, nc);
    return c;
}

extern "C" int nstf_gpu_cross_entropy_launches(const uint16_t *h, int64_t n_tok, int64_t dim, int64_t n_vocab,
                                               int64_t rows, int with_dw) {
    int k = 1; /* ce_finish_kernel */
    bool wt_made = false;
    for (int64_t r0 = 0; rows > 0 && r0 < n_tok; r0 += rows) {
        const int64_t nc = n_tok - r0 < rows ? n_tok - r0 : rows;
        const ce_chunk_plan c = ce_plan(h + r0 * dim, with_dw, nc, dim, n_vocab);
        k += 4 + (c.dh_fast && !wt_made) + (with_dw ? 1 + c.dw_kmajor : 0);
        wt_made = wt_made || c.dh_fast;
    }
    return k;
}

extern "C" nstf_status nstf_gpu_cross_entropy(const uint16_t *h, const uint16_t *w, const int32_t *targets,
                                              int32_t ignore_index, double n_norm, float *lse, float *dh, float *dw,
                                              double *loss, int64_t n_tok, int64_t dim, int64_t n_vocab, int64_t rows,
                                              void *scratch, size_t scratch_bytes, void *stream) {
    if (!h || !w || !targets || !dh || !loss || !scratch || n_tok <= 0 || dim <= 0 || n_vocab <= 0 ||
        !(n_norm > 0) || rows < 8 || rows % 8 || rows > (int64_t)65535 * 32 || n_vocab > (int64_t)65535 * 32)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_cross_entropy: bad arguments (n_tok %lld, dim %lld, vocab %lld, n_norm %g, "
                              "chunks of %lld rows)",
                              (long long)n_tok, (long long)dim, (long long)n_vocab, n_norm, (long long)rows);
    if (n_vocab % 8 || dim % 8)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "nstf_gpu_cross_entropy: vocabulary %lld and width %lld must be multiples of 8",
                              (long long)n_vocab, (long long)dim);
    const uint64_t need = nstf_gpu_cross_entropy_scratch_bytes(n_tok, rows, dim, n_vocab);
    if (need > scratch_bytes)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_cross_entropy: scratch of %zu bytes is too small (%llu for %lld rows)",
                              scratch_bytes, (unsigned long long)need, (long long)rows);
    gpuStream_t s = (gpuStream_t)stream;
    const size_t vd = (size_t)n_vocab * (size_t)dim, rv = (size_t)rows * (size_t)n_vocab;
    char *p = (char *)scratch;
    float *rl = (float *)p;
    p += nstf_gpu_ce_round(4 * (uint64_t)n_tok);
    float *zt = (float *)p;
    p += nstf_gpu_ce_round(4 * (uint64_t)n_tok);
    u16 *wt = (u16 *)p; /* W^T [dim, V], made when a chunk's dh takes the wgmma GEMM */
    p += nstf_gpu_ce_round(2 * vd);
    float *z = (float *)p;
    p += nstf_gpu_ce_round(4 * rv);
    u16 *g = (u16 *)p;
    p += nstf_gpu_ce_round(2 * rv);
    u16 *gt = (u16 *)p;
    p += nstf_gpu_ce_round(2 * rv);
    u16 *ht = (u16 *)p;
    const float inv = (float)(1.0 / n_norm);
    bool wt_made = false;
    for (int64_t r0 = 0; r0 < n_tok; r0 += rows) {
        const int64_t nc = n_tok - r0 < rows ? n_tok - r0 : rows;
        const uint16_t *hc = h + r0 * dim;
        NSTF_TRY(nstf_gpu_gemm_bf16(hc, w, z, NSTF_TYPE_F32, NULL, NSTF_TYPE_F32, nc, n_vocab, dim, NSTF_GEMM_EPI_NONE,
                                    stream));
        ce_row_kernel<<<(unsigned)(nc < NSTF_GPU_MAX_GRID ? nc : NSTF_GPU_MAX_GRID), CE_THREADS, 0, s>>>(
            z, n_vocab, targets + r0, ignore_index, rl + r0, zt + r0, nc);
        GPU_LAUNCH_CHECK(s);
        const ce_chunk_plan c = ce_plan(hc, dw != NULL, nc, dim, n_vocab);
        ce_grad_kernel<<<dim3((unsigned)((n_vocab + 31) / 32), (unsigned)((nc + 31) / 32)), CE_THREADS, 0, s>>>(
            z, n_vocab, targets + r0, ignore_index, rl + r0, inv, g, c.dw_kmajor ? gt : NULL, nc);
        GPU_LAUNCH_CHECK(s);
        /* dh_c [nc, dim] = G [nc, V] W [V, dim] */
        if (c.dh_fast) {
            if (!wt_made) NSTF_TRY(nstf_gpu_transpose_bf16(w, dim, wt, n_vocab, dim, stream));
            wt_made = true;
            NSTF_TRY(nstf_gpu_gemm_bf16(g, wt, dh + r0 * dim, NSTF_TYPE_F32, NULL, NSTF_TYPE_F32, nc, dim, n_vocab,
                                        NSTF_GEMM_EPI_NONE, stream));
        } else {
            NSTF_TRY(nstf_gpu_gemm_ex(g, n_vocab, 0, w, dim, 1, dh + r0 * dim, NSTF_TYPE_F32, dim, nc, dim, n_vocab, 0,
                                      stream));
        }
        /* dW [V, dim] += G^T [V, nc] h_c [nc, dim] */
        if (c.dw_mn) {
            NSTF_TRY(nstf_gpu_gemm_dw(g, n_vocab, hc, dim, dw, n_vocab, dim, nc, NULL, 0, stream));
        } else if (c.dw_kmajor) {
            NSTF_TRY(nstf_gpu_transpose_bf16(hc, dim, ht, nc, dim, stream));
            NSTF_TRY(nstf_gpu_gemm_bf16(gt, ht, dw, NSTF_TYPE_F32, dw, NSTF_TYPE_F32, n_vocab, dim, nc,
                                        NSTF_GEMM_EPI_RESIDUAL, stream));
        } else if (dw) {
            NSTF_TRY(nstf_gpu_gemm_ex(g, n_vocab, 1, hc, dim, 1, dw, NSTF_TYPE_F32, dim, n_vocab, dim, nc, 1, stream));
        }
    }
    ce_finish_kernel<<<1, CE_THREADS, 0, s>>>(rl, zt, targets, ignore_index, 1.0 / n_norm, lse, loss, n_tok);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
