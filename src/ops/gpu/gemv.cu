/* gemv.cu — decode GEMV with fused dequantization: y[t, o] = sum_i
 * W[o, i] x[t, i] for 1..8 tokens, W as stored (F32/F16/BF16/Q8_0/Q4_0/
 * Q4_1), x bf16, fp32 accumulation, y F32 or BF16. The decode hot path:
 * its speed is the weight bytes over the memory bandwidth.
 *
 * Two kernels: gemvq_kernel (below, "quantized kernel") for Q8_0, Q4_0 and
 * 4-byte aligned Q4_1; gemv_kernel for F32/F16/BF16 and for Q4_1 weights
 * that are only 2-byte aligned.
 *
 * Shape of gemv_kernel:
 *  - A block of 256 threads owns GEMV_ROWS = 8 consecutive output rows
 *    (wave-agnostic: one row per wave on wave32, two on wave64), so the
 *    host never needs the wave width.
 *  - x is staged in shared memory as bf16, [NT][chunk]; the chunk is the
 *    whole of n_in when NT * n_in * 2 fits GEMV_SMEM_BYTES (every Llama
 *    shape at NT = 1), else x is walked in chunks. Staging once per block
 *    makes the L2 traffic for x 1/8 of the per-row re-reads.
 *  - A lane processes "units" of 8 weights: one 16-byte load for F16/BF16
 *    (two for F32), four bytes of a Q4_1 block (8 nibbles: elements
 *    4j..4j+3 and 16+4j..16+4j+3) read with 16-bit loads.
 *  - Each weight is loaded and decoded once and used for all NT tokens.
 *    GEMV_UNROLL units per lane are loaded before any is used, to keep
 *    enough bytes in flight per SM to cover the memory latency.
 *  - Q4_1 nibbles become floats with the 2^23 trick: the float with
 *    bits 0x4B000000 | n is 8388608 + n, so one OR and one FADD replace a
 *    (quarter-rate) integer-to-float conversion.
 *  - F32/F16/BF16 rows that are not 16-byte aligned (n_in % 8 != 0 or an
 *    unaligned pointer) take a scalar path, one element per unit. */
#include "gpu.h"
#include "core/switches.h"
#include "fused_math.h"

#include <stdio.h>
#include <stdlib.h>

#define GEMV_THREADS 256
#define GEMV_ROWS 8
#define GEMV_SMEM_BYTES 32768 /* x staging: 7 blocks of 256 threads per SM on H100 */
#define GEMV_UNROLL 4
#define GEMV_MAX_NT 8

enum { GW_F32, GW_F16, GW_BF16, GW_Q8_0, GW_Q4_0, GW_Q4_1, GW_F32_S, GW_F16_S, GW_BF16_S };

/* Elements of W per unit (8, or 1 on the scalar paths). */
template <int WT> struct gemv_traits {
    static constexpr int elems = (WT >= GW_F32_S) ? 1 : 8;
};

static __device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) {
    return *(const uint16_t *)p;
}
static __device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p) {
    return ld_u16(p) | (ld_u16(p + 2) << 16); /* 2-byte aligned 32-bit read */
}

/* Raw bytes of one unit, loaded before decoding. */
struct gemv_raw {
    uint4 a, b;
};

template <int WT>
static __device__ __forceinline__ gemv_raw gemv_load(const uint8_t *__restrict__ row, int u) {
    gemv_raw r;
    if (WT == GW_BF16 || WT == GW_F16) {
        r.a = *(const uint4 *)(row + (size_t)u * 16);
    } else if (WT == GW_F32) {
        r.a = *(const uint4 *)(row + (size_t)u * 32);
        r.b = *(const uint4 *)(row + (size_t)u * 32 + 16);
    } else if (WT == GW_Q4_1) { /* bytes qs[4j..4j+3] of block b (2-byte aligned W) */
        const uint8_t *blk = row + (size_t)(u >> 2) * NSTF_Q4_1_BYTES;
        r.a.x = ld_u16(blk);
        r.a.z = ld_u16(blk + 2);
        r.a.y = ld_u32_a2(blk + 4 + (u & 3) * 4);
    } else if (WT == GW_F32_S) {
        r.a.x = *(const uint32_t *)(row + (size_t)u * 4);
    } else { /* GW_F16_S, GW_BF16_S */
        r.a.x = ld_u16(row + (size_t)u * 2);
    }
    return r;
}

/* x offset (elements) of the k-th weight of unit u, within the chunk. */
template <int WT> static __device__ __forceinline__ int gemv_xoff(int u) {
    if (WT == GW_Q4_1) return (u >> 2) * 32 + (u & 3) * 4;
    return u * gemv_traits<WT>::elems;
}

/* Accumulates unit u into acc[0..NT). xs is the staged chunk [NT][chunk]. */
template <int WT, int NT>
static __device__ __forceinline__ void gemv_unit(const gemv_raw &r, int u,
                                                 const uint16_t *__restrict__ xs, int chunk,
                                                 float (&acc)[NT]) {
    const int xo = gemv_xoff<WT>(u);
    if (gemv_traits<WT>::elems == 1) {
        float wv;
        if (WT == GW_F32_S) wv = __uint_as_float(r.a.x);
        else if (WT == GW_F16_S) wv = nstf_half_bits_to_float((unsigned short)r.a.x);
        else wv = __uint_as_float(r.a.x << 16);
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = fmaf(wv, __uint_as_float((uint32_t)xs[t * chunk + xo] << 16), acc[t]);
        return;
    }
    float wv[8];
    if (WT == GW_BF16) {
        const uint32_t p[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            wv[2 * k] = nstf_bf16lo_to_float(p[k]);
            wv[2 * k + 1] = nstf_bf16hi_to_float(p[k]);
        }
    } else if (WT == GW_F16) {
        const uint32_t p[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            wv[2 * k] = nstf_half_bits_to_float((unsigned short)(p[k] & 0xffffu));
            wv[2 * k + 1] = nstf_half_bits_to_float((unsigned short)(p[k] >> 16));
        }
    } else if (WT == GW_F32) {
        wv[0] = __uint_as_float(r.a.x); wv[1] = __uint_as_float(r.a.y);
        wv[2] = __uint_as_float(r.a.z); wv[3] = __uint_as_float(r.a.w);
        wv[4] = __uint_as_float(r.b.x); wv[5] = __uint_as_float(r.b.y);
        wv[6] = __uint_as_float(r.b.z); wv[7] = __uint_as_float(r.b.w);
    } else { /* Q4_1: low nibbles are elements 4j+k, high ones 16+4j+k */
        const uint32_t q = r.a.y;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            wv[k] = __uint_as_float(0x4B000000u | ((q >> (8 * k)) & 0xfu)) - 8388608.0f;
            wv[4 + k] = __uint_as_float(0x4B000000u | ((q >> (8 * k + 4)) & 0xfu)) - 8388608.0f;
        }
        /* w = d * n + m: dequantize once, share across tokens */
        const float d = nstf_half_bits_to_float((unsigned short)r.a.x);
        const float m = nstf_half_bits_to_float((unsigned short)r.a.z);
#pragma unroll
        for (int k = 0; k < 8; k++) wv[k] = fmaf(d, wv[k], m);
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint16_t *xt = xs + t * chunk + xo;
        uint32_t xw[4];
        if (WT == GW_Q4_1) { /* x[4j..4j+3] and x[16+4j..16+4j+3] */
            const uint2 a = *(const uint2 *)xt, b = *(const uint2 *)(xt + 16);
            xw[0] = a.x; xw[1] = a.y; xw[2] = b.x; xw[3] = b.y;
        } else {
            const uint4 a = *(const uint4 *)xt;
            xw[0] = a.x; xw[1] = a.y; xw[2] = a.z; xw[3] = a.w;
        }
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            s = fmaf(wv[2 * k], nstf_bf16lo_to_float(xw[k]), s);
            s = fmaf(wv[2 * k + 1], nstf_bf16hi_to_float(xw[k]), s);
        }
        acc[t] += s;
    }
}

/* ---- fusions (nstf_gpu_gemv_fused) ---------------------------------------- *
 * FZ = norm bit | epilogue << 1. FZ 0 is the plain GEMV. A fused kernel is
 * one token (NT 1). The epilogues ROPE and SWIGLU combine two rows: a block
 * of R row slots then computes R/2 pairs, slot s < R/2 the first row of
 * pair s and slot R/2 + s the second, and after the reduction the pairs
 * meet in shared memory. Pairs: SWIGLU (j, n_out/2 + j); ROPE, in the
 * rotated rows, (head h, dim 2i | 2i+1) or (i | i + head_dim/2) for NEOX,
 * past them (2p, 2p + 1) stored plainly. */
#define FZ_NORM 1
#define FZ_EPI(fz) ((fz) >> 1)

struct gemv_fz {
    const float *nx, *nw; /* norm prologue: f32 x and weights */
    float eps;
    int rope_rows, hd, neox;
    const int32_t *pos;
    const float *freqs; /* [hd/2] hi, [hd/2] lo */
    int prefetch;       /* bytes per row to L2-prefetch before the PDL wait (0: none)... */
    int pf_blocks;      /* ...in blocks below this index (the first wave) */
    int no_pre;         /* 1: no early weight loads (the switch NSTF_GEMV_PRE=0, measurement) */
};

#define FZ_PAIR(fz) (FZ_EPI(fz) == NSTF_GEMV_ROPE || FZ_EPI(fz) == NSTF_GEMV_SWIGLU)

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

static __device__ __forceinline__ float bf16_round(float v) { return nstf_bf16_to_float(nstf_float_to_bf16(v)); }

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
    if (2 * p >= f.rope_rows) {
        yb[2 * p] = nstf_float_to_bf16(a);
        yb[2 * p + 1] = nstf_float_to_bf16(b);
        return;
    }
    const int half = f.hd / 2, h = p / half, i = p % half;
    const int r0 = h * f.hd + (f.neox ? i : 2 * i), r1 = r0 + (f.neox ? half : 1);
    float c, sn;
    nstf_rope_cs(*f.pos, f.freqs[i], f.freqs[half + i], &c, &sn);
    float y0, y1;
    nstf_rope_rot(a, b, c, sn, &y0, &y1);
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

template <int WT, int NT, bool Y_BF16, int FZ, int ROWS = GEMV_ROWS>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kernel(const uint8_t *__restrict__ w, size_t row_bytes, const uint16_t *__restrict__ x,
            void *__restrict__ y, int n_in, int n_out, int chunk, int x_vec, const gemv_fz f) {
    extern __shared__ uint4 gemv_smem[]; /* uint4: 16-byte aligned */
    __shared__ float fz_sh[32];
    uint16_t *xs = (uint16_t *)gemv_smem;
    constexpr int N_WAVES = GEMV_THREADS / NSTF_WAVE;
    constexpr int RPW = ROWS / N_WAVES; /* rows per wave */
    static_assert(RPW >= 1 && RPW * N_WAVES == ROWS, "ROWS must be a multiple of the waves per block");
    static_assert(FZ == 0 || NT == 1, "fused GEMVs are one token");
    constexpr int EL = gemv_traits<WT>::elems;
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    int rowv[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) rowv[r] = fz_row<FZ, ROWS>(blockIdx.x, wave * RPW + r, n_out, f);
    if (NT == 1 && f.prefetch) fz_prefetch<RPW>(w, row_bytes, rowv, n_out, lane, f); /* PDL: decode only */
    /* One token, one chunk: the first weight loads of the first row are
     * issued now, before the wait for the previous kernel and the staging
     * of x, and consumed in the first pass of the loop below. */
    const bool pre_on = NT == 1 && !f.no_pre && chunk >= n_in && rowv[0] < n_out;
    gemv_raw pre[GEMV_UNROLL];
    if (pre_on) {
#pragma unroll
        for (int k = 0; k < GEMV_UNROLL; k++) {
            const int u = lane + k * NSTF_WAVE;
            if (u < n_in / EL) pre[k] = gemv_load<WT>(w + (size_t)rowv[0] * row_bytes, u);
        }
    }
    const float rn = fz_begin<FZ>(f, n_in, fz_sh);

    float acc[RPW][NT];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;

    for (int c0 = 0; c0 < n_in; c0 += chunk) {
        const int len = min(chunk, n_in - c0);
        __syncthreads(); /* the previous chunk is consumed */
        if (FZ & FZ_NORM) { /* one chunk: the host checks */
            for (int i = threadIdx.x; i < len; i += GEMV_THREADS) xs[i] = fz_xnorm(f, i, rn).bits;
        } else if (x_vec) { /* 16-byte copies: n_in % 8 == 0 and x aligned, so len % 8 == 0 */
            for (int t = 0; t < NT; t++)
                for (int i = threadIdx.x * 8; i < len; i += GEMV_THREADS * 8)
                    *(uint4 *)(xs + t * chunk + i) = *(const uint4 *)(x + (size_t)t * n_in + c0 + i);
        } else {
            for (int t = 0; t < NT; t++)
                for (int i = threadIdx.x; i < len; i += GEMV_THREADS)
                    xs[t * chunk + i] = x[(size_t)t * n_in + c0 + i];
        }
        __syncthreads();
        const int n_units = len / EL;
        /* units before this chunk: c0 / EL (chunk is a multiple of 32) */
        const int ubase = c0 / EL;
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int row = rowv[r];
            if (row >= n_out) continue;
            const uint8_t *wr = w + (size_t)row * row_bytes;
            for (int u0 = lane; u0 < n_units; u0 += NSTF_WAVE * GEMV_UNROLL) {
                gemv_raw raw[GEMV_UNROLL];
                if (r == 0 && pre_on && u0 == lane) {
#pragma unroll
                    for (int k = 0; k < GEMV_UNROLL; k++) raw[k] = pre[k];
                } else {
#pragma unroll
                    for (int k = 0; k < GEMV_UNROLL; k++) {
                        const int u = u0 + k * NSTF_WAVE;
                        if (u < n_units) raw[k] = gemv_load<WT>(wr, ubase + u);
                    }
                }
#pragma unroll
                for (int k = 0; k < GEMV_UNROLL; k++) {
                    const int u = u0 + k * NSTF_WAVE;
                    if (u < n_units) gemv_unit<WT, NT>(raw[k], u, xs, chunk, acc[r]);
                }
            }
        }
    }
    if (FZ) {
        float v[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) v[r] = wave_reduce_sum(acc[r][0]);
        fz_store<FZ, Y_BF16, ROWS, RPW>(v, rowv, y, n_out, f, fz_sh);
    } else {
        gemv_store<NT, Y_BF16, RPW>(acc, rowv, y, n_out, lane);
    }
}

/* ---- quantized kernel ---------------------------------------------------- *
 * Q8_0, Q4_0 and Q4_1 (4-byte aligned W) take gemvq_kernel:
 *  - A block of 256 threads owns ROWS = 16 rows (32 when n_out >= 8192),
 *    RPW = ROWS / waves rows per wave (2 or 4 on wave32). A wave walks its
 *    RPW rows together, so every x fragment read from shared memory and
 *    converted to fp32 serves RPW rows.
 *  - x is staged per block in shared memory (bf16, or fp32 at NT = 1) in
 *    the "plane" layout of gemvq_xslot: the lanes of a wave read
 *    consecutive 16-byte items, free of bank conflicts.
 *  - A lane's unit is half a block, 16 weights: for Q8_0 qs[16h..16h+15]
 *    (elements 16h..16h+15), for Q4 qs[8h..8h+7] (low nibbles: elements
 *    8h..8h+7, high nibbles: 16+8h..16+8h+7). The qs run starts 2-byte
 *    aligned; it is read with 32-bit loads from the 4-byte aligned address
 *    at or below it plus one 16-bit tail load, and realigned with one byte
 *    permute per word (selector chosen from the address): 6 loads per
 *    16 Q8_0 weights, 4 for Q4_0, 3 for Q4_1 (always 4-byte aligned there).
 *  - Q8_0 decodes with one byte permute + one FADD per weight: the float
 *    with bits 0x4B0000uu is 2^23 + uu, uu = n + 128 after flipping the
 *    sign bits of the four bytes at once.
 *  - Q4 decodes with one byte permute per weight and no FADD: the float
 *    with bits 0x3F800000 | n << 16 is f = 1 + n/128 (n the raw nibble,
 *    0..15), so n = 128 f - 128. With s = sum f x and X = sum x over the
 *    unit's 16 x values, sum (n - 8) x = 128 s - 136 X (Q4_0) and
 *    sum (d n + m) x = 128 d s + (m - 128 d) X (Q4_1). X is row-independent
 *    and computed once per block while staging x. The cancellation costs a
 *    factor of about 10 on fp32 rounding (s ~ X ~ sum x): far inside the
 *    accuracy rule.
 *  - Each lane keeps GEMVQ_UNROLL units of each of its rows in flight. */
#define GEMVQ_ROWS 16
#define GEMVQ_ROWS_BIG 32   /* n_out >= GEMVQ_BIG_OUT: more x reuse, still enough blocks */
#define GEMVQ_BIG_OUT 8192
#ifndef GEMVQ_UNROLL
#define GEMVQ_UNROLL 2
#endif

/* 4 bytes at p (4-byte aligned) */
static __device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) { return *(const uint32_t *)p; }

/* Raw bytes of one half-block unit. q[0..NQ): words at the 4-aligned
 * address at or below the run, q[NQ]: the 16-bit tail, sc: scale (and the
 * Q4_1 min in the high half); mis: the run is 2 mod 4 (realign). */
template <int WT> struct gemvq_raw {
    static constexpr int NQ = (WT == GW_Q8_0) ? 4 : 2;
    uint32_t q[NQ + 1];
    uint32_t sc;
    uint32_t mis;
};

template <int WT>
static __device__ __forceinline__ gemvq_raw<WT> gemvq_load(const uint8_t *__restrict__ row, int u) {
    gemvq_raw<WT> r;
    constexpr int NQ = gemvq_raw<WT>::NQ;
    const int b = u >> 1, h = u & 1;
    if (WT == GW_Q4_1) { /* 20-byte blocks, 4-byte aligned rows: everything aligned */
        const uint8_t *blk = row + (size_t)b * NSTF_Q4_1_BYTES;
        r.sc = ld_u32(blk);
        r.q[0] = ld_u32(blk + 4 + h * 8);
        r.q[1] = ld_u32(blk + 8 + h * 8);
        r.q[2] = 0;
        r.mis = 0;
        return r;
    }
    const uint8_t *blk = row + (size_t)b * (WT == GW_Q8_0 ? NSTF_Q8_0_BYTES : NSTF_Q4_0_BYTES);
    const uint8_t *p = blk + 2 + h * (4 * NQ);
    const uint8_t *a = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
    r.sc = ld_u16(blk);
#pragma unroll
    for (int k = 0; k < NQ; k++) r.q[k] = ld_u32(a + 4 * k);
    /* the last two bytes of the run: needed when a = p - 2; never past it */
    r.q[NQ] = ld_u16(p + 4 * NQ - 2);
    r.mis = (uint32_t)((uintptr_t)p & 2);
    return r;
}

/* Staged x layout: per token, the unit's two runs of 8 x values are in
 * separate "planes" of 16-byte items indexed by the unit, so the lanes of
 * a wave (consecutive units) read consecutive 16-byte items: no bank
 * conflicts. bf16: plane p (run p) = nu items of 8 bf16; fp32 (XF): plane
 * 2p + q = nu items of 4 floats (quad q of run p). nu = chunk / 16.
 * gemvq_xslot maps element e of the chunk to (run p, unit u, offset o). */
template <int WT>
static __device__ __forceinline__ void gemvq_xslot(int e, int &p, int &u, int &o) {
    o = e & 7;
    if (WT == GW_Q8_0) {
        u = e >> 4;
        p = (e >> 3) & 1;
    } else { /* element 32b + 16p + 8h + o of block b */
        p = (e >> 4) & 1;
        u = ((e >> 5) << 1) | ((e >> 3) & 1);
    }
}

/* The unit's 16 x values as fp32 from token row xs_t (bf16) or xs32_t (XF). */
template <int WT, bool XF>
static __device__ __forceinline__ void gemvq_xfrag(const uint16_t *xs, const float *xs32, int u,
                                                   int nu, float (&xf)[16]) {
    if (XF) {
        const float4 *q4 = (const float4 *)xs32;
        const float4 a = q4[u], b = q4[nu + u], c = q4[2 * nu + u], d = q4[3 * nu + u];
        xf[0] = a.x; xf[1] = a.y; xf[2] = a.z; xf[3] = a.w;
        xf[4] = b.x; xf[5] = b.y; xf[6] = b.z; xf[7] = b.w;
        xf[8] = c.x; xf[9] = c.y; xf[10] = c.z; xf[11] = c.w;
        xf[12] = d.x; xf[13] = d.y; xf[14] = d.z; xf[15] = d.w;
    } else {
        const uint4 a = ((const uint4 *)xs)[u], c = ((const uint4 *)xs)[nu + u];
        const uint32_t xw[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            xf[2 * k] = nstf_bf16lo_to_float(xw[k]);
            xf[2 * k + 1] = nstf_bf16hi_to_float(xw[k]);
        }
    }
}

template <int WT, int NT, bool Y_BF16, int ROWS, int FZ>
__global__ void __launch_bounds__(GEMV_THREADS)
gemvq_kernel(const uint8_t *__restrict__ w, size_t row_bytes, const uint16_t *__restrict__ x,
             void *__restrict__ y, int n_in, int n_out, int chunk, int x_vec, const gemv_fz f) {
    extern __shared__ uint4 gemv_smem[];
    __shared__ float fz_sh[ROWS > 32 ? ROWS : 32];
    static_assert(FZ == 0 || NT == 1, "fused GEMVs are one token");
    /* x: bf16 [NT][chunk], or fp32 [chunk] when NT == 1 (converted once
     * while staging; the shared-memory traffic is affordable for one token) */
    constexpr bool XF = NT == 1;
    uint16_t *xs = (uint16_t *)gemv_smem;
    float *xs32 = (float *)gemv_smem;
    float *xsum = XF ? xs32 + chunk : (float *)(xs + NT * chunk); /* Q4: [NT][chunk / 16] */
    constexpr bool Q4 = WT != GW_Q8_0;
    constexpr int N_WAVES = GEMV_THREADS / NSTF_WAVE;
    constexpr int RPW = ROWS / N_WAVES;
    static_assert(RPW >= 1 && RPW * N_WAVES == ROWS, "ROWS must be a multiple of the waves per block");
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    int rowv[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) rowv[r] = fz_row<FZ, ROWS>(blockIdx.x, wave * RPW + r, n_out, f);
    const uint8_t *wr[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) /* rows past the end re-read the last row; never stored */
        wr[r] = w + (size_t)min(rowv[r], n_out - 1) * row_bytes;
    if (NT == 1 && f.prefetch) fz_prefetch<RPW>(w, row_bytes, rowv, n_out, lane, f); /* PDL: decode only */
    /* one token, one chunk: the first unit of each row loaded before the
     * wait (as in gemv_kernel; one unit, not GEMVQ_UNROLL, and not in the
     * 32-row blocks: registers) */
    const bool pre_on = NT == 1 && RPW <= 2 && !f.no_pre && chunk >= n_in && lane < n_in / 16;
    gemvq_raw<WT> pre[RPW];
    if (pre_on) {
#pragma unroll
        for (int r = 0; r < RPW; r++) pre[r] = gemvq_load<WT>(wr[r], lane);
    }
    const float rn = fz_begin<FZ>(f, n_in, fz_sh);

    float acc[RPW][NT];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;

    const int nu_chunk = chunk / 16;
    for (int c0 = 0; c0 < n_in; c0 += chunk) {
        const int len = min(chunk, n_in - c0);
        const int n_units = len / 16;
        __syncthreads(); /* the previous chunk is consumed */
        if (FZ & FZ_NORM) { /* one chunk, NT 1 (XF): the host checks */
            for (int i = threadIdx.x; i < len; i += GEMV_THREADS) {
                int p, u, o;
                gemvq_xslot<WT>(i, p, u, o);
                xs32[((2 * p + (o >> 2)) * nu_chunk + u) * 4 + (o & 3)] = nstf_bf16_to_float(fz_xnorm(f, i, rn));
            }
        } else if (XF && x_vec) {
            for (int i = threadIdx.x * 8; i < len; i += GEMV_THREADS * 8) {
                const uint4 a = *(const uint4 *)(x + c0 + i);
                const uint32_t v[4] = {a.x, a.y, a.z, a.w};
                int p, u, o;
                gemvq_xslot<WT>(i, p, u, o);
                float4 *d = (float4 *)xs32;
                d[(2 * p) * nu_chunk + u] = make_float4(nstf_bf16lo_to_float(v[0]), nstf_bf16hi_to_float(v[0]),
                                                        nstf_bf16lo_to_float(v[1]), nstf_bf16hi_to_float(v[1]));
                d[(2 * p + 1) * nu_chunk + u] = make_float4(nstf_bf16lo_to_float(v[2]), nstf_bf16hi_to_float(v[2]),
                                                            nstf_bf16lo_to_float(v[3]), nstf_bf16hi_to_float(v[3]));
            }
        } else if (XF) {
            for (int i = threadIdx.x; i < len; i += GEMV_THREADS) {
                int p, u, o;
                gemvq_xslot<WT>(i, p, u, o);
                xs32[((2 * p + (o >> 2)) * nu_chunk + u) * 4 + (o & 3)] = nstf_bf16lo_to_float(x[c0 + i]);
            }
        } else if (x_vec) {
            for (int t = 0; t < NT; t++)
                for (int i = threadIdx.x * 8; i < len; i += GEMV_THREADS * 8) {
                    int p, u, o;
                    gemvq_xslot<WT>(i, p, u, o);
                    ((uint4 *)(xs + t * chunk))[p * nu_chunk + u] = *(const uint4 *)(x + (size_t)t * n_in + c0 + i);
                }
        } else {
            for (int t = 0; t < NT; t++)
                for (int i = threadIdx.x; i < len; i += GEMV_THREADS) {
                    int p, u, o;
                    gemvq_xslot<WT>(i, p, u, o);
                    xs[t * chunk + (p * nu_chunk + u) * 8 + o] = x[(size_t)t * n_in + c0 + i];
                }
        }
        __syncthreads();
        if (Q4) {
            for (int i = threadIdx.x; i < NT * n_units; i += GEMV_THREADS) {
                const int t = i / n_units, u = i - t * n_units;
                float xf[16];
                gemvq_xfrag<WT, XF>(xs + t * chunk, xs32, u, nu_chunk, xf);
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < 16; k++) s += xf[k];
                xsum[t * nu_chunk + u] = s;
            }
            __syncthreads();
        }
        const int ubase = c0 / 16;
        for (int u0 = lane; u0 < n_units; u0 += NSTF_WAVE * GEMVQ_UNROLL) {
            gemvq_raw<WT> raw[GEMVQ_UNROLL][RPW];
#pragma unroll
            for (int k = 0; k < GEMVQ_UNROLL; k++) {
                const int u = u0 + k * NSTF_WAVE;
                if (u < n_units) {
                    const bool from_pre = k == 0 && pre_on && u0 == lane;
#pragma unroll
                    for (int r = 0; r < RPW; r++) raw[k][r] = from_pre ? pre[r] : gemvq_load<WT>(wr[r], ubase + u);
                }
            }
#pragma unroll
            for (int k = 0; k < GEMVQ_UNROLL; k++) {
                const int u = u0 + k * NSTF_WAVE;
                if (u >= n_units) break;
                /* decode the RPW rows' 16 weights once */
                float wv[RPW][16];
                float c1[RPW], c0q[RPW];
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    const gemvq_raw<WT> &rw = raw[k][r];
                    constexpr int NQ = gemvq_raw<WT>::NQ;
                    const uint32_t sel = rw.mis ? 0x5432u : 0x3210u;
                    uint32_t q[NQ];
#pragma unroll
                    for (int j = 0; j < NQ; j++) q[j] = __byte_perm(rw.q[j], rw.q[j + 1], sel);
                    const float d = nstf_half_bits_to_float((unsigned short)(rw.sc & 0xffffu));
                    if (WT == GW_Q8_0) {
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const uint32_t v = q[j] ^ 0x80808080u;
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                wv[r][4 * j + e] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440u | e)) - 8388736.0f;
                        }
                        c1[r] = d;
                        c0q[r] = 0.0f;
                    } else {
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            const uint32_t lo = (q[j] & 0x0F0F0F0Fu) | 0x80808080u;
                            const uint32_t hi = ((q[j] >> 4) & 0x0F0F0F0Fu) | 0x80808080u;
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                wv[r][4 * j + e] = __uint_as_float(__byte_perm(lo, 0x3F000000u, 0x7044u | (e << 8)));
                                wv[r][8 + 4 * j + e] = __uint_as_float(__byte_perm(hi, 0x3F000000u, 0x7044u | (e << 8)));
                            }
                        }
                        c1[r] = 128.0f * d;
                        if (WT == GW_Q4_0) c0q[r] = -136.0f * d;
                        else c0q[r] = nstf_half_bits_to_float((unsigned short)(rw.sc >> 16)) - 128.0f * d;
                    }
                }
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    float xf[16];
                    gemvq_xfrag<WT, XF>(xs + t * chunk, xs32, u, nu_chunk, xf);
                    const float X = Q4 ? xsum[t * nu_chunk + u] : 0.0f;
#pragma unroll
                    for (int r = 0; r < RPW; r++) {
                        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                        for (int e = 0; e < 8; e++) {
                            s0 = fmaf(wv[r][e], xf[e], s0);
                            s1 = fmaf(wv[r][8 + e], xf[8 + e], s1);
                        }
                        float a2 = acc[r][t];
                        if (Q4) a2 = fmaf(c0q[r], X, a2);
                        acc[r][t] = fmaf(c1[r], s0 + s1, a2);
                    }
                }
            }
        }
    }
    if (FZ) {
        float v[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) v[r] = wave_reduce_sum(acc[r][0]);
        fz_store<FZ, Y_BF16, ROWS, RPW>(v, rowv, y, n_out, f, fz_sh);
    } else {
        gemv_store<NT, Y_BF16, RPW>(acc, rowv, y, n_out, lane);
    }
}

/* ---- launcher ------------------------------------------------------------ */

struct gemv_plan {
    int wt;        /* GW_* */
    int chunk;     /* x elements staged per pass */
    int n_chunks;
    int x_vec;
    int quant;     /* gemvq_kernel (Q8_0, Q4_0, 4-byte aligned Q4_1) */
    size_t smem;
};

static int gemv_wt(nstf_type t, bool vec) {
    switch (t) {
    case NSTF_TYPE_F32: return vec ? GW_F32 : GW_F32_S;
    case NSTF_TYPE_F16: return vec ? GW_F16 : GW_F16_S;
    case NSTF_TYPE_BF16: return vec ? GW_BF16 : GW_BF16_S;
    case NSTF_TYPE_Q8_0: return GW_Q8_0;
    case NSTF_TYPE_Q4_0: return GW_Q4_0;
    case NSTF_TYPE_Q4_1: return GW_Q4_1;
    }
    return -1;
}

static gemv_plan gemv_make_plan(nstf_type wtype, const void *w, const uint16_t *x, int nt,
                                int64_t n_in) {
    gemv_plan p;
    const bool x_al = ((uintptr_t)x % 16) == 0 && n_in % 8 == 0;
    const bool w_al = ((uintptr_t)w % 16) == 0 && n_in % 8 == 0;
    p.wt = gemv_wt(wtype, w_al && x_al);
    p.x_vec = x_al;
    p.quant = p.wt == GW_Q8_0 || p.wt == GW_Q4_0 || (p.wt == GW_Q4_1 && (uintptr_t)w % 4 == 0);
    /* chunk: a multiple of 32 elements (a quantized block; 16 bytes of bf16
     * x), as large as the staging budget allows for nt token rows. */
    const int xbytes = (p.quant && nt == 1) ? 4 : 2; /* gemvq stages fp32 x for one token */
    int64_t cap = (GEMV_SMEM_BYTES / (xbytes * nt)) / 32 * 32;
    int64_t need = (n_in + 31) / 32 * 32;
    p.chunk = (int)(need < cap ? need : cap);
    p.n_chunks = (int)((n_in + p.chunk - 1) / p.chunk);
    p.smem = (size_t)nt * (size_t)p.chunk * (size_t)xbytes;
    if (p.quant && p.wt != GW_Q8_0) p.smem += (size_t)nt * (size_t)(p.chunk / 16) * 4; /* x sums */
    return p;
}

static const char *gemv_wt_name(int wt) {
    static const char *names[] = {"f32/vec", "f16/vec", "bf16/vec", "q8_0", "q4_0", "q4_1",
                                  "f32/scalar", "f16/scalar", "bf16/scalar"};
    return wt >= 0 && wt <= GW_BF16_S ? names[wt] : "?";
}

extern "C" const char *nstf_gpu_gemv_config(nstf_type wtype, const void *w, const uint16_t *x,
                                            int64_t n_tok, int64_t n_in) {
    static char buf[128];
    int nt = (int)(n_tok < GEMV_MAX_NT ? n_tok : GEMV_MAX_NT);
    if (nt < 1) nt = 1;
    gemv_plan p = gemv_make_plan(wtype, w, x, nt, n_in);
    snprintf(buf, sizeof buf, "%s%s nt=%d chunk=%dx%d x=%s", gemv_wt_name(p.wt),
             p.quant ? "/half-block" : (p.wt == GW_Q4_1 ? "/a2" : ""), nt, p.chunk, p.n_chunks,
             p.x_vec ? (p.quant && nt == 1 ? "vec/f32" : "vec") : "scalar");
    return buf;
}

typedef void (*gemv_fn)(const uint8_t *, size_t, const uint16_t *, void *, int, int, int, int, const gemv_fz);

template <int WT, bool YB> static gemv_fn gemv_pick_nt(int nt) {
    switch (nt) {
    case 1: return gemv_kernel<WT, 1, YB, 0>;
    case 2: return gemv_kernel<WT, 2, YB, 0>;
    case 3: return gemv_kernel<WT, 3, YB, 0>;
    case 4: return gemv_kernel<WT, 4, YB, 0>;
    case 5: return gemv_kernel<WT, 5, YB, 0>;
    case 6: return gemv_kernel<WT, 6, YB, 0>;
    case 7: return gemv_kernel<WT, 7, YB, 0>;
    default: return gemv_kernel<WT, 8, YB, 0>;
    }
}

template <int WT, bool YB, int R> static gemv_fn gemvq_pick_nt(int nt) {
    switch (nt) {
    case 1: return gemvq_kernel<WT, 1, YB, R, 0>;
    case 2: return gemvq_kernel<WT, 2, YB, R, 0>;
    case 3: return gemvq_kernel<WT, 3, YB, R, 0>;
    case 4: return gemvq_kernel<WT, 4, YB, R, 0>;
    case 5: return gemvq_kernel<WT, 5, YB, R, 0>;
    case 6: return gemvq_kernel<WT, 6, YB, R, 0>;
    case 7: return gemvq_kernel<WT, 7, YB, R, 0>;
    default: return gemvq_kernel<WT, 8, YB, R, 0>;
    }
}

/* Q8_0 / Q4_0 always, Q4_1 when 4-byte aligned: the half-block kernel. */
template <bool YB, int R> static gemv_fn gemvq_pick_r(int wt, int nt) {
    switch (wt) {
    case GW_Q8_0: return gemvq_pick_nt<GW_Q8_0, YB, R>(nt);
    case GW_Q4_0: return gemvq_pick_nt<GW_Q4_0, YB, R>(nt);
    default: return gemvq_pick_nt<GW_Q4_1, YB, R>(nt);
    }
}
template <bool YB> static gemv_fn gemvq_pick(int wt, int nt, int rows) {
    return rows == GEMVQ_ROWS_BIG ? gemvq_pick_r<YB, GEMVQ_ROWS_BIG>(wt, nt) : gemvq_pick_r<YB, GEMVQ_ROWS>(wt, nt);
}

/* Float types, and Q4_1 rows that are only 2-byte aligned. */
template <bool YB> static gemv_fn gemv_pick(int wt, int nt) {
    switch (wt) {
    case GW_F32: return gemv_pick_nt<GW_F32, YB>(nt);
    case GW_F16: return gemv_pick_nt<GW_F16, YB>(nt);
    case GW_BF16: return gemv_pick_nt<GW_BF16, YB>(nt);
    case GW_Q4_1: return gemv_pick_nt<GW_Q4_1, YB>(nt);
    case GW_F32_S: return gemv_pick_nt<GW_F32_S, YB>(nt);
    case GW_F16_S: return gemv_pick_nt<GW_F16_S, YB>(nt);
    default: return gemv_pick_nt<GW_BF16_S, YB>(nt);
    }
}

/* The prefetch before the PDL wait: under PDL only, whole rows, in the
 * blocks of the first wave (8 per SM), of matrices of at most GEMV_PF_MAX
 * bytes. On the H100 that is what pays: the decode of the 135M model gains
 * 5% from it, while prefetching (even 4 KiB of each row of) the 1B and 8B
 * matrices costs 7-20%: the first wave's lines are evicted from L2 before
 * they are read. The switch NSTF_PF_BYTES=n prefetches n bytes of each row
 * of every matrix instead (measurement). */
#define GEMV_PF_MAX ((uint64_t)8 << 20)
static void gemv_prefetch_plan(gemv_fz *f, uint64_t matrix_bytes) {
    static thread_local int n_sm = 0, dev_cached = -1; /* the current device is per host thread */
    int dev = 0;
    if (!nstf_gpu_pdl() || gpuGetDevice(&dev) != gpuSuccess) return;
    if (dev != dev_cached) {
        gpuDeviceProp_t pr;
        n_sm = gpuGetDeviceProperties(&pr, dev) == gpuSuccess ? pr.multiProcessorCount : 0;
        dev_cached = dev;
    }
    const int pf = nstf_switch_int(NSTF_SW_PF_BYTES); /* NSTF_SWITCH_AUTO or bytes */
    f->prefetch = pf >= 0 ? pf : matrix_bytes <= GEMV_PF_MAX ? INT32_MAX : 0;
    f->pf_blocks = 8 * n_sm;
}

extern "C" nstf_status nstf_gpu_gemv(nstf_type wtype, const void *w, const uint16_t *x, void *y,
                                     nstf_type y_type, int64_t n_tok, int64_t n_in,
                                     int64_t n_out, void *stream) {
    if (!w || !x || !y || n_tok < 0 || n_in <= 0 || n_out < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_gemv: bad arguments (n_tok %lld, n_in %lld, n_out %lld)",
                              (long long)n_tok, (long long)n_in, (long long)n_out);
    if (gemv_wt(wtype, true) < 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_gemv: weight type %s",
                              nstf_type_name(wtype));
    if (y_type != NSTF_TYPE_F32 && y_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_gemv: output type %s (F32 or BF16)",
                              nstf_type_name(y_type));
    uint64_t row_bytes = 0;
    if (!nstf_type_row_bytes(wtype, n_in, &row_bytes))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_gemv: n_in %lld is not a whole number of %s blocks",
                              (long long)n_in, nstf_type_name(wtype));
    if (n_in > INT32_MAX / 2 || n_out > INT32_MAX - GEMVQ_ROWS_BIG)
        return nstf_set_error(NSTF_ERR_RANGE, "nstf_gpu_gemv: n_in %lld / n_out %lld too large",
                              (long long)n_in, (long long)n_out);
    if (n_tok == 0 || n_out == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const size_t ysz = y_type == NSTF_TYPE_BF16 ? 2 : 4;
    for (int64_t t0 = 0; t0 < n_tok; t0 += GEMV_MAX_NT) {
        const int nt = (int)(n_tok - t0 < GEMV_MAX_NT ? n_tok - t0 : GEMV_MAX_NT);
        const uint16_t *xt = x + t0 * n_in;
        gemv_plan p = gemv_make_plan(wtype, w, xt, nt, n_in);
        gemv_fn fn;
        const int rows = !p.quant ? GEMV_ROWS : n_out >= GEMVQ_BIG_OUT ? GEMVQ_ROWS_BIG : GEMVQ_ROWS;
        if (p.quant) fn = y_type == NSTF_TYPE_BF16 ? gemvq_pick<true>(p.wt, nt, rows) : gemvq_pick<false>(p.wt, nt, rows);
        else fn = y_type == NSTF_TYPE_BF16 ? gemv_pick<true>(p.wt, nt) : gemv_pick<false>(p.wt, nt);
        const unsigned grid = (unsigned)((n_out + rows - 1) / rows);
        gemv_fz f = {};
        f.no_pre = !nstf_switch_int(NSTF_SW_GEMV_PRE);
        gemv_prefetch_plan(&f, row_bytes * (uint64_t)n_out);
        GPU_CHECK(nstf_gpu_launch(fn, dim3(grid), dim3(GEMV_THREADS), p.smem, s, nstf_gpu_pdl(), (const uint8_t *)w,
                                  (size_t)row_bytes, xt, (void *)((char *)y + (size_t)(t0 * n_out) * ysz), (int)n_in,
                                  (int)n_out, p.chunk, p.x_vec, f));
        GPU_LAUNCH_CHECK(s);
    }
    return NSTF_OK;
}

/* ---- fused launcher -------------------------------------------------------- */

extern "C" int nstf_gpu_gemv_fusable(nstf_type wtype, const void *w, int64_t n_in, int norm) {
    if (!w || n_in <= 0 || n_in > INT32_MAX / 2 || gemv_wt(wtype, true) < 0) return 0;
    uint64_t rb = 0;
    if (!nstf_type_row_bytes(wtype, n_in, &rb)) return 0;
    const gemv_plan p = gemv_make_plan(wtype, w, NULL, 1, n_in); /* x is staged, never read in place */
    if (!p.quant && p.wt != GW_BF16) return 0;
    return !norm || p.n_chunks == 1;
}

/* Rows per block of the fused bf16 kernel: more rows share one staging of
 * x (and one norm) as n_out grows. The switch NSTF_GEMV_ROWS=8|16|32
 * overrides it (measurement). */
static int gemv_fused_rows(int64_t n_out) {
    const int sw = nstf_switch_int(NSTF_SW_GEMV_ROWS); /* NSTF_SWITCH_AUTO, 8, 16 or 32 */
    if (sw != NSTF_SWITCH_AUTO) return sw;
    return n_out >= 16384 ? 16 : GEMV_ROWS;
}

/* One fused instance: weight kind (GW_BF16 or a quantized GW_*) x FZ; bf16
 * blocks of 8, 16 or 32 rows. */
template <int FZ, bool YB> static gemv_fn gemv_fused_pick(int wt, int rows) {
    switch (wt) {
    case GW_BF16:
        return rows == 32 ? gemv_kernel<GW_BF16, 1, YB, FZ, 32>
               : rows == 16 ? gemv_kernel<GW_BF16, 1, YB, FZ, 16>
                            : gemv_kernel<GW_BF16, 1, YB, FZ, GEMV_ROWS>;
    case GW_Q8_0: return gemvq_kernel<GW_Q8_0, 1, YB, GEMVQ_ROWS, FZ>;
    case GW_Q4_0: return gemvq_kernel<GW_Q4_0, 1, YB, GEMVQ_ROWS, FZ>;
    default: return gemvq_kernel<GW_Q4_1, 1, YB, GEMVQ_ROWS, FZ>;
    }
}

extern "C" nstf_status nstf_gpu_gemv_fused(nstf_type wtype, const void *w, const uint16_t *x, void *y,
                                           int64_t n_in, int64_t n_out, const nstf_gemv_fusion *fu,
                                           void *stream) {
    if (!fu || !y || n_out <= 0 || n_out > INT32_MAX - GEMVQ_ROWS_BIG || (!fu->norm_x && !x) ||
        (fu->norm_x && !fu->norm_w) || !(fu->norm_eps >= 0.0f))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_gemv_fused: bad arguments (n_in %lld, n_out %lld)",
                              (long long)n_in, (long long)n_out);
    const int norm = fu->norm_x != NULL;
    if (!nstf_gpu_gemv_fusable(wtype, w, n_in, norm))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "nstf_gpu_gemv_fused: %s weights of %lld columns%s (see nstf_gpu_gemv_fusable)",
                              nstf_type_name(wtype), (long long)n_in, norm ? " with the norm prologue" : "");
    const nstf_gemv_epi epi = fu->epi;
    if (epi == NSTF_GEMV_ROPE || epi == NSTF_GEMV_SWIGLU) {
        if (n_out % 2) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_gemv_fused: odd n_out %lld", (long long)n_out);
    } else if (epi != NSTF_GEMV_STORE && epi != NSTF_GEMV_ACCUM) {
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_gemv_fused: epilogue %d", (int)epi);
    }
    if (epi == NSTF_GEMV_ROPE &&
        (!fu->pos || !fu->rope_freqs || fu->head_dim <= 0 || fu->head_dim % 2 || fu->head_dim > 256 ||
         fu->rope_rows < 0 || fu->rope_rows % fu->head_dim || fu->rope_rows > n_out ||
         (fu->rope_mode != NSTF_ROPE_NORM && fu->rope_mode != NSTF_ROPE_NEOX) ||
         (fu->head_dim / 2) % (GEMVQ_ROWS / 2) != 0))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_gemv_fused: RoPE of %d rows, head_dim %d, mode %d (rows a multiple of "
                              "head_dim, head_dim/2 a multiple of %d)",
                              fu->rope_rows, fu->head_dim, (int)fu->rope_mode, GEMVQ_ROWS / 2);
    uint64_t row_bytes = 0;
    (void)nstf_type_row_bytes(wtype, n_in, &row_bytes);
    const gemv_plan p = gemv_make_plan(wtype, w, norm ? NULL : x, 1, n_in);
    gemv_fz f = {};
    f.nx = fu->norm_x;
    f.nw = fu->norm_w;
    f.eps = fu->norm_eps;
    f.rope_rows = fu->rope_rows;
    f.hd = fu->head_dim;
    f.neox = fu->rope_mode == NSTF_ROPE_NEOX;
    f.pos = fu->pos;
    f.freqs = fu->rope_freqs;
    f.no_pre = !nstf_switch_int(NSTF_SW_GEMV_PRE);
    gemv_prefetch_plan(&f, row_bytes * (uint64_t)n_out);
    const int rows = p.quant ? GEMVQ_ROWS : gemv_fused_rows(n_out);
    gemv_fn fn;
    switch ((int)epi * 2 + norm) {
    case 0 * 2 + 1: fn = gemv_fused_pick<0 * 2 + 1, false>(p.wt, rows); break;
    case 1 * 2 + 0: fn = gemv_fused_pick<1 * 2 + 0, false>(p.wt, rows); break;
    case 1 * 2 + 1: fn = gemv_fused_pick<1 * 2 + 1, false>(p.wt, rows); break;
    case 2 * 2 + 0: fn = gemv_fused_pick<2 * 2 + 0, true>(p.wt, rows); break;
    case 2 * 2 + 1: fn = gemv_fused_pick<2 * 2 + 1, true>(p.wt, rows); break;
    case 3 * 2 + 0: fn = gemv_fused_pick<3 * 2 + 0, true>(p.wt, rows); break;
    case 3 * 2 + 1: fn = gemv_fused_pick<3 * 2 + 1, true>(p.wt, rows); break;
    default: /* plain STORE: the unfused GEMV */
        return nstf_gpu_gemv(wtype, w, x, y, NSTF_TYPE_F32, 1, n_in, n_out, stream);
    }
    const unsigned grid = (unsigned)((n_out + rows - 1) / rows);
    gpuStream_t s = (gpuStream_t)stream;
    GPU_CHECK(nstf_gpu_launch(fn, dim3(grid), dim3(GEMV_THREADS), p.smem, s, nstf_gpu_pdl(), (const uint8_t *)w,
                              (size_t)row_bytes, x, y, (int)n_in, (int)n_out, p.chunk, p.x_vec, f));
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
