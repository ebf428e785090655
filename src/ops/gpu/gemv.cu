/* gemv.cu — decode GEMV with fused dequantization: y[t, o] = sum_i
 * W[o, i] x[t, i] for 1..8 tokens, W as stored (every type of core/dtype.h),
 * x bf16, fp32 accumulation, y F32 or BF16. The decode hot path: its speed
 * is the weight bytes over the memory bandwidth.
 *
 * This file: the float kernel gemv_kernel (F32/F16/BF16, and Q4_1
 * weights that are only 2-byte aligned) and the launcher nstf_gpu_gemv,
 * which takes the quantized kernel of gemvq.cu for the 32-element block
 * types (Q8_0, Q4_0, 4-byte aligned Q4_1, Q5_0, Q5_1, IQ4_NL) and the
 * super-block kernel of gemvk.cu for the 256-element ones (Q2_K .. Q6_K,
 * IQ4_XS). The fused GEMVs (norm prologue; RoPE, SwiGLU, residual
 * epilogues) are instances of all three: gemv_fused.h (device side) and
 * gemv_fused.cu (nstf_gpu_gemv_fused). gemv_common.h holds what they share.
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
#include "gemv_fused.h"
#include "core/switches.h"

#include <stdio.h>

#define GEMV_UNROLL 4

/* Elements of W per unit (8, or 1 on the scalar paths). */
template <int WT> struct gemv_traits {
    static constexpr int elems = (WT >= GW_F32_S && WT <= GW_BF16_S) ? 1 : 8;
};

static __device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p) {
    return nstf_ld_u16(p) | (nstf_ld_u16(p + 2) << 16); /* 2-byte aligned 32-bit read */
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
        r.a.x = nstf_ld_u16(blk);
        r.a.z = nstf_ld_u16(blk + 2);
        r.a.y = ld_u32_a2(blk + 4 + (u & 3) * 4);
    } else if (WT == GW_F32_S) {
        r.a.x = *(const uint32_t *)(row + (size_t)u * 4);
    } else { /* GW_F16_S, GW_BF16_S */
        r.a.x = nstf_ld_u16(row + (size_t)u * 2);
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
    gemv_rows<FZ, ROWS>(rowv, wave, n_out, f);
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
    gemv_acc_zero(acc);

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
    gemv_finish<FZ, NT, Y_BF16, ROWS>(acc, rowv, y, n_out, f, fz_sh, lane);
}

/* ---- launcher ------------------------------------------------------------ */

static const char *gemv_wt_name(int wt) {
    static const char *names[GW_N] = {"f32/vec", "f16/vec", "bf16/vec", "q8_0", "q4_0", "q4_1",
                                      "f32/scalar", "f16/scalar", "bf16/scalar", "q5_0", "q5_1", "iq4_nl",
                                      "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "q4_0/split",
                                      "iq4_nl/split", "q8_0/split", "q6_k/split"};
    return wt >= 0 && wt < GW_N ? names[wt] : "?";
}

extern "C" const char *nstf_gpu_gemv_config(nstf_type wtype, const void *w, const uint16_t *x,
                                            int64_t n_tok, int64_t n_in) {
    static char buf[128];
    int nt = (int)(n_tok < GEMV_MAX_NT ? n_tok : GEMV_MAX_NT);
    if (nt < 1) nt = 1;
    gemv_plan p = gemv_make_plan(wtype, w, x, nt, n_in);
    snprintf(buf, sizeof buf, "%s%s nt=%d chunk=%dx%d x=%s", gemv_wt_name(p.wt),
             p.i8 ? "/int8" : p.super ? "/super-block" : p.quant ? "/half-block" : (p.wt == GW_Q4_1 ? "/a2" : ""), nt, p.chunk,
             p.n_chunks, p.x_vec ? ((p.quant && nt == 1) || p.super ? "vec/f32" : "vec") : "scalar");
    return buf;
}

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

/* The fused BF16 and F16 instances (gemv_fused.cu). */
template <int WT> struct gemv_float_fused {
    int rows;
    template <int FZ, bool YB> gemv_fn get() const {
        return rows == 32 ? gemv_kernel<WT, 1, YB, FZ, 32>
               : rows == 16 ? gemv_kernel<WT, 1, YB, FZ, 16>
                            : gemv_kernel<WT, 1, YB, FZ, GEMV_ROWS>;
    }
};
int nstf_gemv_fz_bytes(void) { return (int)sizeof(gemv_fz); }
gemv_fn nstf_gemv_float_fused_pick(int wt, int fz, int rows) {
    if (wt == GW_F16) return gemv_fz_dispatch(fz, gemv_float_fused<GW_F16>{rows});
    return gemv_fz_dispatch(fz, gemv_float_fused<GW_BF16>{rows});
}

/* The prefetch before the PDL wait: under PDL only, whole rows, in the
 * blocks of the first wave (8 per SM), of matrices of at most GEMV_PF_MAX
 * bytes. On the H100 that is what pays: the decode of the 135M model gains
 * 5% from it, while prefetching (even 4 KiB of each row of) the 1B and 8B
 * matrices costs 7-20%: the first wave's lines are evicted from L2 before
 * they are read. The switch NSTF_PF_BYTES=n prefetches n bytes of each row
 * of every matrix instead (measurement). */
#define GEMV_PF_MAX ((uint64_t)8 << 20)

void nstf_gemv_prefetch_plan(gemv_fz *f, uint64_t matrix_bytes) {
    if (!nstf_gpu_pdl()) return;
    const int n_sm = nstf_gpu_n_sm();
    if (n_sm < 0) return;
    const int pf = nstf_switch_int(NSTF_SW_PF_BYTES); /* NSTF_SWITCH_AUTO or bytes */
    f->prefetch = pf >= 0 ? pf : matrix_bytes <= GEMV_PF_MAX ? INT32_MAX : 0;
    f->pf_blocks = 8 * n_sm;
}

/* Rows per block of the one-token integer GEMV: 32 for wide outputs (more
 * rows share one staging of x; not with RoPE, whose pairs stay in blocks
 * of at most GEMVQ_ROWS); 8 for a 32-element type with rows of 4096 or
 * more where blocks of 16 would not fill two per SM (twice the warps to
 * cover the loads: the 8B shape's out and down projections); else 16. On
 * the H100 the 8-row blocks lost on shorter rows and on the K-quants
 * (docs/PERFORMANCE.md), so those have no 8-row instances. The switch
 * NSTF_GEMV_ROWS=16|32 overrides it (measurement; 32 with RoPE stays 16,
 * 8 applies where the 8-row instances exist). */
int nstf_gemvk8_rows(int wt, int64_t n_in, int64_t n_out, int rope) {
    const bool small_ok = !GW_SUPER(wt);
    const int sw = nstf_switch_int(NSTF_SW_GEMV_ROWS);
    if (sw != NSTF_SWITCH_AUTO)
        return rope && sw == GEMVQ_ROWS_BIG ? GEMVQ_ROWS : sw == GEMVQ_ROWS_SMALL && !small_ok ? GEMVQ_ROWS : sw;
    if (n_out >= GEMVQ_BIG_OUT && !rope) return GEMVQ_ROWS_BIG;
    if (!small_ok || n_in < 4096) return GEMVQ_ROWS;
    const int n_sm = nstf_gpu_n_sm(); /* no device: 16-row blocks, as before */
    return (n_out + GEMVQ_ROWS - 1) / GEMVQ_ROWS < 2 * (int64_t)n_sm ? GEMVQ_ROWS_SMALL : GEMVQ_ROWS;
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
    if (gemv_make_plan(wtype, w, x, 1, n_in).wt < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_gemv: %s weights with rows of %lld must be %d-byte aligned",
                              nstf_type_name(wtype), (long long)n_in, nstf_gpu_w_align((int)wtype, n_in));
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
        const int rows = !p.quant ? GEMV_ROWS
                         : p.i8   ? nstf_gemvk8_rows(p.wt, n_in, n_out, 0)
                         : nt == 1 && n_out >= GEMVQ_BIG_OUT ? GEMVQ_ROWS_BIG : GEMVQ_ROWS;
        if (p.i8) fn = nstf_gemvk8_pick(p.wt, rows, y_type == NSTF_TYPE_BF16);
        else if (p.super) fn = nstf_gemvk_pick(p.wt, nt, rows, y_type == NSTF_TYPE_BF16);
        else if (p.quant) fn = nstf_gemvq_pick(p.wt, nt, rows, y_type == NSTF_TYPE_BF16);
        else fn = y_type == NSTF_TYPE_BF16 ? gemv_pick<true>(p.wt, nt) : gemv_pick<false>(p.wt, nt);
        if (!fn) return nstf_set_error(NSTF_ERR_INTERNAL, "nstf_gpu_gemv: no instance for %d tokens of %d rows", nt, rows);
        const unsigned grid = (unsigned)((n_out + rows - 1) / rows);
        gemv_fz f = {};
        f.no_pre = !nstf_switch_int(NSTF_SW_GEMV_PRE);
        nstf_gemv_prefetch_plan(&f, row_bytes * (uint64_t)n_out);
        GPU_CHECK(nstf_gpu_launch(fn, dim3(grid), dim3(GEMV_THREADS), p.smem, s, nstf_gpu_pdl(), (const uint8_t *)w,
                                  (size_t)row_bytes, xt, (void *)((char *)y + (size_t)(t0 * n_out) * ysz), (int)n_in,
                                  (int)n_out, p.chunk, p.x_vec, f));
        GPU_LAUNCH_CHECK(s);
    }
    return NSTF_OK;
}
