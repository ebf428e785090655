/* gemvq.cu — the quantized decode GEMV kernel gemvq_kernel, fused
 * dequantization for the 32-element block types Q8_0, Q4_0, Q4_1 (4-byte
 * aligned W), Q5_0, Q5_1 and IQ4_NL, and its instances for 2..8 tokens
 * (nstf_gpu_gemv in gemv.cu); one token, plain and fused, is
 * gemvk_i8.cu's (the kernel's NT = 1 and FZ paths are not instantiated).
 * Shape:
 *  - A block of 256 threads owns ROWS = 16 rows (32 for one token when n_out >= 8192),
 *    RPW = ROWS / waves rows per wave (2 or 4 on wave32). A wave walks its
 *    RPW rows together, so every x fragment read from shared memory and
 *    converted to fp32 serves RPW rows.
 *  - x is staged per block in shared memory (bf16, or fp32 at NT = 1) in
 *    the "plane" layout of gemvq_xslot: the lanes of a wave read
 *    consecutive 16-byte items, free of bank conflicts.
 *  - A lane's unit is half a block, 16 weights: for Q8_0 qs[16h..16h+15]
 *    (elements 16h..16h+15), for the 4-bit layouts (Q4_0, Q4_1, Q5_0,
 *    Q5_1, IQ4_NL) qs[8h..8h+7] (low nibbles: elements 8h..8h+7, high
 *    nibbles: 16+8h..16+8h+7). The qs run starts 2-byte aligned; it is
 *    read with 32-bit loads from the 4-byte aligned address at or below it
 *    plus one 16-bit tail load, and realigned with one byte permute per
 *    word (selector chosen from the address): 6 loads per 16 Q8_0 weights,
 *    4 for Q4_0 and IQ4_NL, 3 for Q4_1 (always 4-byte aligned there); Q5_0
 *    adds two 16-bit loads of qh, Q5_1 (4-byte aligned) one word. Rows in
 *    the GPU's split layout (Q4_0, IQ4_NL, Q8_0; quant.h) load their
 *    aligned codes as plain words and the scale apart.
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
 *    accuracy rule. Q5_0 / Q5_1 put qh's bit into bit 4 of the byte first
 *    (n < 32): sum (n - 16) x = 128 s - 144 X and as Q4_1.
 *  - IQ4_NL codes go through the code book (quant.h's byte-permute lookup)
 *    to bytes 128 + kv, then as Q8_0 to exact floats: no X term.
 *  - Each lane keeps GEMVQ_UNROLL units of each of its rows in flight. */
#include "gemv_fused.h"

#ifndef GEMVQ_UNROLL
#define GEMVQ_UNROLL 2
#endif

/* Raw bytes of one half-block unit. q[0..NQ): words at the 4-aligned
 * address at or below the run, q[NQ]: the 16-bit tail, sc: scale (and the
 * Q4_1 min in the high half); mis: the run is 2 mod 4 (realign). */
template <int WT> struct gemvq_raw {
    static constexpr int NQ = (WT == GW_Q8_0) ? 4 : 2;
    uint32_t q[NQ + 1];
    uint32_t sc;
    uint32_t mis;
    uint32_t qh; /* Q5_0, Q5_1: the block's fifth bits */
};

/* qs of the 4-bit layouts: bytes from the block start; block bytes */
template <int WT> struct gemvq_layout {
    static constexpr int QS = WT == GW_Q8_0 || WT == GW_Q4_0 || WT == GW_IQ4_NL ? 2 : WT == GW_Q5_0 ? 6 : WT == GW_Q4_1 ? 4 : 8;
    static constexpr int BYTES = WT == GW_Q8_0 ? NSTF_Q8_0_BYTES : WT == GW_Q4_0 ? NSTF_Q4_0_BYTES
                                 : WT == GW_Q4_1 ? NSTF_Q4_1_BYTES : WT == GW_Q5_0 ? NSTF_Q5_0_BYTES
                                 : WT == GW_Q5_1 ? NSTF_Q5_1_BYTES : NSTF_IQ4_NL_BYTES;
    static constexpr bool NEEDX = WT != GW_Q8_0 && WT != GW_IQ4_NL; /* the 1 + n/128 codes: X term */
};

template <int WT>
static __device__ __forceinline__ gemvq_raw<WT> gemvq_load(const uint8_t *__restrict__ row, int u, int nbs) {
    gemvq_raw<WT> r;
    constexpr int NQ = gemvq_raw<WT>::NQ;
    typedef gemvq_layout<WT> L;
    const int b = u >> 1, h = u & 1;
    r.qh = 0;
    if constexpr (WT == GW_Q4_0 || WT == GW_IQ4_NL || WT == GW_Q8_0) {
        if (nbs) { /* the GPU's split rows (quant.h): nbs scales, then runs of 16 or 32 codes; aligned */
            const uint8_t *p = row + 2 * (size_t)nbs + (size_t)(L::BYTES - 2) * b + 4 * NQ * h;
            r.sc = nstf_ld_u16(row + 2 * b);
#pragma unroll
            for (int k = 0; k < NQ; k++) r.q[k] = nstf_ld_u32(p + 4 * k);
            r.q[NQ] = 0;
            r.mis = 0;
            return r;
        }
    }
    if constexpr (WT == GW_Q4_1 || WT == GW_Q5_1) { /* 20/24-byte blocks, 4-byte aligned rows: everything aligned */
        const uint8_t *blk = row + (size_t)b * L::BYTES;
        r.sc = nstf_ld_u32(blk);
        r.q[0] = nstf_ld_u32(blk + L::QS + h * 8);
        r.q[1] = nstf_ld_u32(blk + L::QS + 4 + h * 8);
        r.q[2] = 0;
        r.mis = 0;
        if constexpr (WT == GW_Q5_1) r.qh = nstf_ld_u32(blk + 4);
        return r;
    }
    const uint8_t *blk = row + (size_t)b * L::BYTES;
    const uint8_t *p = blk + L::QS + h * (4 * NQ);
    if constexpr (WT == GW_Q5_0) r.qh = nstf_ld_u16(blk + 2) | (nstf_ld_u16(blk + 4) << 16);
    const uint8_t *a = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
    r.sc = nstf_ld_u16(blk);
#pragma unroll
    for (int k = 0; k < NQ; k++) r.q[k] = nstf_ld_u32(a + 4 * k);
    /* the last two bytes of the run: needed when a = p - 2; never past it */
    r.q[NQ] = nstf_ld_u16(p + 4 * NQ - 2);
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
    constexpr bool Q4 = gemvq_layout<WT>::NEEDX;
    constexpr int N_WAVES = GEMV_THREADS / NSTF_WAVE;
    constexpr int RPW = ROWS / N_WAVES;
    static_assert(RPW >= 1 && RPW * N_WAVES == ROWS, "ROWS must be a multiple of the waves per block");
    const int lane = threadIdx.x % NSTF_WAVE;
    int rowv[RPW];
    const uint8_t *wr[RPW];
    gemv_row_ptrs<FZ, ROWS>(rowv, wr, w, row_bytes, n_out, f, NT == 1);
    /* one token, one chunk: the first unit of each row loaded before the
     * wait (as in gemv_kernel; one unit, not GEMVQ_UNROLL, and not in the
     * 32-row blocks: registers) */
    const bool pre_on = NT == 1 && RPW <= 2 && !f.no_pre && chunk >= n_in && lane < n_in / 16;
    constexpr int ST = WT == GW_Q4_0 ? NSTF_TYPE_Q4_0 : WT == GW_IQ4_NL ? NSTF_TYPE_IQ4_NL : WT == GW_Q8_0 ? NSTF_TYPE_Q8_0 : -1;
    const int nbs = nstf_gpu_split_codes(ST, n_in) ? n_in / 32 : 0; /* the row's layout (quant.h) */
    gemvq_raw<WT> pre[RPW];
    if (pre_on) {
#pragma unroll
        for (int r = 0; r < RPW; r++) pre[r] = gemvq_load<WT>(wr[r], lane, nbs);
    }
    const float rn = fz_begin<FZ>(f, n_in, fz_sh);

    float acc[RPW][NT];
    gemv_acc_zero(acc);

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
                    for (int r = 0; r < RPW; r++) raw[k][r] = from_pre ? pre[r] : gemvq_load<WT>(wr[r], ubase + u, nbs);
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
                    uint32_t q[NQ];
#pragma unroll
                    for (int j = 0; j < NQ; j++) q[j] = nstf_realign2(rw.q[j], rw.q[j + 1], rw.mis);
                    const float d = nstf_half_bits_to_float((unsigned short)(rw.sc & 0xffffu));
                    if constexpr (WT == GW_Q8_0) {
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const uint32_t v = q[j] ^ 0x80808080u;
#pragma unroll
                            for (int e = 0; e < 4; e++) wv[r][4 * j + e] = nstf_byte_2p23(v, e) - 8388736.0f;
                        }
                        c1[r] = d;
                        c0q[r] = 0.0f;
                    } else if constexpr (WT == GW_IQ4_NL) {
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            const uint32_t lo = nstf_iq4_lookup4(q[j] & 0x0F0F0F0Fu);
                            const uint32_t hi = nstf_iq4_lookup4((q[j] >> 4) & 0x0F0F0F0Fu);
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                wv[r][4 * j + e] = nstf_byte_2p23(lo, e) - 8388736.0f;
                                wv[r][8 + 4 * j + e] = nstf_byte_2p23(hi, e) - 8388736.0f;
                            }
                        }
                        c1[r] = d;
                        c0q[r] = 0.0f;
                    } else {
                        const int h = u & 1; /* Q5: the fifth bits of elements 8h + .. and 16 + 8h + .. */
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            uint32_t lo = (q[j] & 0x0F0F0F0Fu) | 0x80808080u;
                            uint32_t hi = ((q[j] >> 4) & 0x0F0F0F0Fu) | 0x80808080u;
                            if constexpr (WT == GW_Q5_0 || WT == GW_Q5_1) {
                                lo |= nstf_spread4_b4((rw.qh >> (8 * h + 4 * j)) & 0xfu);
                                hi |= nstf_spread4_b4((rw.qh >> (16 + 8 * h + 4 * j)) & 0xfu);
                            }
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                wv[r][4 * j + e] = nstf_byte_1p(lo, e);
                                wv[r][8 + 4 * j + e] = nstf_byte_1p(hi, e);
                            }
                        }
                        c1[r] = 128.0f * d;
                        if constexpr (WT == GW_Q4_0) c0q[r] = -136.0f * d;
                        else if constexpr (WT == GW_Q5_0) c0q[r] = -144.0f * d;
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
    gemv_finish<FZ, NT, Y_BF16, ROWS>(acc, rowv, y, n_out, f, fz_sh, lane);
}

/* ---- instances ------------------------------------------------------------ */

/* The 32-element types (Q4_1 when 4-byte aligned): the half-block kernel. */
struct gemvq_k {
    template <int WT, int NT, bool YB, int R, int FZ> static gemv_fn fn() {
        if constexpr (NT == 1) return nullptr; /* one token: gemvk_i8.cu's */
        else return gemvq_kernel<WT, NT, YB, R, FZ>;
    }
    template <bool YB, int R> static gemv_fn pick(int wt, int nt) {
        switch (wt) {
        /* the split kinds: the kernel tells the layout from n_in */
        case GW_Q8_0:
        case GW_Q8_0S: return gemv_pick_nt<gemvq_k, GW_Q8_0, YB, R>(nt);
        case GW_Q4_0:
        case GW_Q4_0S: return gemv_pick_nt<gemvq_k, GW_Q4_0, YB, R>(nt);
        case GW_Q5_0: return gemv_pick_nt<gemvq_k, GW_Q5_0, YB, R>(nt);
        case GW_Q5_1: return gemv_pick_nt<gemvq_k, GW_Q5_1, YB, R>(nt);
        case GW_IQ4_NL:
        case GW_IQ4_NLS: return gemv_pick_nt<gemvq_k, GW_IQ4_NL, YB, R>(nt);
        default: return gemv_pick_nt<gemvq_k, GW_Q4_1, YB, R>(nt);
        }
    }
};

gemv_fn nstf_gemvq_pick(int wt, int nt, int rows, bool y_bf16) { return gemv_pick_plain<gemvq_k>(wt, nt, rows, y_bf16); }

/* The fused instances (decode, one token) are gemvk_i8.cu's. */
int nstf_gemvq_fz_bytes(void) { return (int)sizeof(gemv_fz); }
