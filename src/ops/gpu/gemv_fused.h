/* gemv_fused.h — the device side of the fused GEMVs, shared by the GEMV
 * kernels (gemv.cu, gemvq.cu, gemvk.cu) through their FZ template
 * parameter: the rows of a block's slots, the L2 prefetch before the PDL
 * wait, the norm prologue, the RoPE (with the QKV bias) / SwiGLU /
 * residual epilogues, the plain store (FZ 0), and the frame of a block the
 * kernels share (row slots, accumulators, the final store). The host side
 * is gemv_fused.cu. */
#ifndef NSTF_GEMV_FUSED_H
#define NSTF_GEMV_FUSED_H

#include "gemv_common.h"
#include "fused_math.h"

/* The weight row of slot `slot` of block `blk` (R slots), or n_out if none. */
template <int FZ, int R>
static __device__ __forceinline__ int fz_row(int blk, int slot, int n_out, const gemv_fz &f) {
    if (!FZ_PAIR(FZ)) return min(blk * R + slot, n_out);
    constexpr int P = R / 2;
    const int p = blk * P + (slot % P), second = slot >= P;
    if (FZ_EPI(FZ) == NSTF_GEMV_SWIGLU) return p < n_out / 2 ? (second ? n_out / 2 + p : p) : n_out;
    if (2 * p >= n_out) return n_out;
    if (2 * p >= f.rope_rows) return 2 * p + second;
    const int half = f.hd / 2, h = p / half, i = p % half;
    return h * f.hd + (f.neox ? i + second * half : 2 * i + second);
}

/* Starts the first `bytes` of the block's weight rows towards L2 (one bulk
 * prefetch per row, lane 0 of each wave, the 16-byte aligned interior of
 * the row): work a kernel launched early (PDL) does while the previous one
 * ends. Only the first wave of blocks does it, and only so much of a row
 * that the prefetched lines stay in L2 until they are read. */
template <int RPW>
static __device__ __forceinline__ void fz_prefetch(const uint8_t *w, size_t row_bytes, const int (&rowv)[RPW],
                                                   int n_out, int lane, const gemv_fz &f) {
    if (lane != 0 || (int)blockIdx.x >= f.pf_blocks) return;
    const size_t bytes = row_bytes < (size_t)f.prefetch ? row_bytes : (size_t)f.prefetch;
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        if (rowv[r] >= n_out) continue;
        const uintptr_t a = (uintptr_t)(w + (size_t)rowv[r] * row_bytes);
        const uintptr_t a0 = (a + 15) & ~(uintptr_t)15, a1 = (a + bytes) & ~(uintptr_t)15;
        if (a1 > a0) NSTF_L2_PREFETCH((const void *)a0, a1 - a0);
    }
}

/* Norm prologue: 1 / rms of f.nx over n (the block-wide sum of squares in
 * nstf_gpu_rmsnorm's order: GEMV_THREADS threads as its block). */
static __device__ __forceinline__ float fz_rnorm(const gemv_fz &f, int n, float *red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += GEMV_THREADS) {
        const float v = f.nx[i];
        ss = fmaf(v, v, ss);
    }
    ss = block_reduce_sum(ss, red);
    return nstf_fast_rsqrtf(ss / (float)n + f.eps);
}

/* After the work on constant data: wait for the previous kernel (PDL), let
 * the next one be scheduled, and return the norm prologue's 1 / rms (0
 * without it). Every thread of the block calls it. */
template <int FZ>
static __device__ __forceinline__ float fz_begin(const gemv_fz &f, int n, float *red) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    return (FZ & FZ_NORM) ? fz_rnorm(f, n, red) : 0.0f;
}

/* The normalized input element i, rounded to bf16 as nstf_gpu_rmsnorm stores it. */
static __device__ __forceinline__ nstf_bf16 fz_xnorm(const gemv_fz &f, int i, float rn) {
    return nstf_float_to_bf16(f.nx[i] * rn * f.nw[i]);
}


/* Elements i .. i + 7 of a staged chunk as floats: the normalized input
 * under the norm prologue (FZ_NORM: one token, one chunk, so i indexes the
 * row; the host checks), else xc[i ..] (xc: the token's row at the chunk)
 * by one 16-byte load where x_vec says x is so aligned. */
template <int FZ>
static __device__ __forceinline__ void gemv_x8(const gemv_fz &f, const uint16_t *__restrict__ xc, int i, int x_vec,
                                               float rn, float (&v)[8]) {
    if (FZ & FZ_NORM) {
#pragma unroll
        for (int o = 0; o < 8; o++) v[o] = nstf_bf16_to_float(fz_xnorm(f, i + o, rn));
    } else if (x_vec) {
        const uint4 q = *(const uint4 *)(xc + i);
        const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int o = 0; o < 4; o++) {
            v[2 * o] = nstf_bf16lo_to_float(qw[o]);
            v[2 * o + 1] = nstf_bf16hi_to_float(qw[o]);
        }
    } else {
#pragma unroll
        for (int o = 0; o < 8; o++) v[o] = nstf_bf16lo_to_float(xc[i + o]);
    }
}

/* Row `row`'s bf16 value v after its matrix's bias, as nstf_gpu_bias adds
 * it (bf16 in, fp32 add, bf16 out); v as is where that matrix has none.
 * The pointers are chosen by selects, not indexed (no scratch). */
static __device__ __forceinline__ float fz_bias(const gemv_fz &f, int row, float v) {
    const bool q = row < f.q_end, k = !q && row < f.k_end;
    const float *b = q ? f.bq : k ? f.bk : f.bv;
    if (!b) return v;
    return bf16_round(v + b[row - (q ? 0 : k ? f.q_end : f.k_end)]);
}

/* Stores the block's results: v[r] is row rowv[r]'s dot product, complete
 * in every lane. Plain epilogues store per row; pair epilogues meet in
 * `pv` (R floats of shared memory). */
template <int FZ, bool Y_BF16, int R, int RPW>
static __device__ __forceinline__ void fz_store(const float (&v)[RPW], const int (&rowv)[RPW], void *y, int n_out,
                                                const gemv_fz &f, float *pv) {
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    if (!FZ_PAIR(FZ)) {
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            if (lane != 0 || rowv[r] >= n_out) continue;
            if (FZ_EPI(FZ) == NSTF_GEMV_ACCUM) ((float *)y)[rowv[r]] += v[r];
            else if (Y_BF16) ((nstf_bf16 *)y)[rowv[r]] = nstf_float_to_bf16(v[r]);
            else ((float *)y)[rowv[r]] = v[r];
        }
        return;
    }
    constexpr int P = R / 2;
#pragma unroll
    for (int r = 0; r < RPW; r++)
        if (lane == 0) pv[wave * RPW + r] = v[r];
    __syncthreads();
    const int j = threadIdx.x;
    if (j >= P) return;
    const int p = blockIdx.x * P + j;
    /* the unfused kernels see their inputs as bf16 */
    const float a = bf16_round(pv[j]), b = bf16_round(pv[P + j]);
    nstf_bf16 *yb = (nstf_bf16 *)y;
    if (FZ_EPI(FZ) == NSTF_GEMV_SWIGLU) {
        if (p < n_out / 2) yb[p] = nstf_float_to_bf16(nstf_swiglu1(a, b));
        return;
    }
    if (2 * p >= n_out) return;
    const bool rot = 2 * p < f.rope_rows;
    const int half = f.hd / 2, i = rot ? p % half : 0;
    const int r0 = rot ? (p / half) * f.hd + (f.neox ? i : 2 * i) : 2 * p, r1 = r0 + (rot && f.neox ? half : 1);
    float a1 = a, b1 = b;
    if (f.bq || f.bk || f.bv) { /* the unfused BIAS op, before RoPE */
        a1 = fz_bias(f, r0, a);
        b1 = fz_bias(f, r1, b);
    }
    if (!rot) {
        yb[r0] = nstf_float_to_bf16(a1);
        yb[r1] = nstf_float_to_bf16(b1);
        return;
    }
    float c, sn, hi = f.freqs[i], lo = f.freqs[half + i];
    if (f.factors) nstf_rope_scale(f.factors[i], &hi, &lo);
    nstf_rope_cs(*f.pos, hi, lo, &c, &sn);
    float y0, y1;
    nstf_rope_rot(a1, b1, c, sn, &y0, &y1);
    yb[r0] = nstf_float_to_bf16(y0);
    yb[r1] = nstf_float_to_bf16(y1);
}

/* The plain store of NT tokens' rows: y[t, row] = the wave's sum (lane t
 * writes token t). */
template <int NT, bool Y_BF16, int RPW>
static __device__ __forceinline__ void gemv_store(const float (&acc)[RPW][NT], const int (&rowv)[RPW], void *y,
                                                  int n_out, int lane) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int row = rowv[r];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = wave_reduce_sum(acc[r][t]);
            if (lane == t && row < n_out) {
                if (Y_BF16) ((nstf_bf16 *)y)[(size_t)t * n_out + row] = nstf_float_to_bf16(v);
                else ((float *)y)[(size_t)t * n_out + row] = v;
            }
        }
    }
}


/* ---- the frame both kernels share ------------------------------------------ */

/* The rows of the wave's RPW row slots (fz_row: n_out for a slot past the end). */
template <int FZ, int ROWS, int RPW>
static __device__ __forceinline__ void gemv_rows(int (&rowv)[RPW], int wave, int n_out, const gemv_fz &f) {
#pragma unroll
    for (int r = 0; r < RPW; r++) rowv[r] = fz_row<FZ, ROWS>(blockIdx.x, wave * RPW + r, n_out, f);
}

/* The wave's row slots (gemv_rows) and their weight rows: a slot past the
 * end re-reads the last row (never stored). With `prefetch` (one token:
 * PDL decode only) the rows' first bytes are started towards L2 too. */
template <int FZ, int ROWS, int RPW>
static __device__ __forceinline__ void gemv_row_ptrs(int (&rowv)[RPW], const uint8_t *(&wr)[RPW], const uint8_t *w,
                                                     size_t row_bytes, int n_out, const gemv_fz &f, bool prefetch) {
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    gemv_rows<FZ, ROWS>(rowv, wave, n_out, f);
#pragma unroll
    for (int r = 0; r < RPW; r++) wr[r] = w + (size_t)min(rowv[r], n_out - 1) * row_bytes;
    if (prefetch && f.prefetch) fz_prefetch<RPW>(w, row_bytes, rowv, n_out, lane, f);
}

/* The fp32 accumulators of RPW rows x NT tokens (per lane), zeroed. */
template <int RPW, int NT> static __device__ __forceinline__ void gemv_acc_zero(float (&acc)[RPW][NT]) {
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
}

/* The end of a block: each row's lane partials summed over the wave and
 * stored, plainly (gemv_store, NT tokens) or through the fused epilogue
 * (fz_store, one token; pv: its shared memory). */
template <int FZ, int NT, bool Y_BF16, int ROWS, int RPW>
static __device__ __forceinline__ void gemv_finish(const float (&acc)[RPW][NT], const int (&rowv)[RPW], void *y,
                                                   int n_out, const gemv_fz &f, float *pv, int lane) {
    if (FZ) {
        float v[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) v[r] = wave_reduce_sum(acc[r][0]);
        fz_store<FZ, Y_BF16, ROWS, RPW>(v, rowv, y, n_out, f, pv);
    } else {
        gemv_store<NT, Y_BF16, RPW>(acc, rowv, y, n_out, lane);
    }
}

#endif
