/* gemvk.cu — the decode GEMV of the 256-element super-block types (Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) with fused dequantization: the kernel
 * gemvk_kernel and its instances (plain for nstf_gpu_gemv in gemv.cu, fused
 * for gemv_fused.cu; one token of Q4_K, Q5_K, Q6_K and IQ4_XS is gemvk_i8.cu's). Same frame as gemvq.cu's kernel (gemv_fused.h: row
 * slots, the norm prologue, the epilogues, the PDL wait and early loads).
 * Shape:
 *  - A block of 256 threads owns ROWS = 16 rows (32 for one token when n_out >= 8192);
 *    a wave walks its RPW rows together so each x fragment read from
 *    shared memory serves RPW rows.
 *  - A lane's unit is a piece of one super-block whose codes share loads:
 *    NRUN "runs" of 16 consecutive elements, each under one sub-block scale
 *    (2 runs of 16 for Q4_K, Q5_K, Q6_K, IQ4_XS: 16 bytes of 4-bit codes,
 *    low and high nibbles; 4 runs for Q2_K and Q3_K: 16 bytes of 2-bit
 *    codes). Units per super-block: 16 / NRUN. See gk_map for which
 *    elements a unit holds, and gk_load / gk_decode per type.
 *  - Codes become floats without integer conversions: a code q < 128 in a
 *    byte 0x80 | q is permuted into the float 1 + q / 128 (quant.h's
 *    nstf_byte_1p). With s = sum f x and X = sum x over a run, a run's
 *    sum (a q + b) x = 128 a s + (b - 128 a) X: per run one scale c1 and
 *    one offset c0 on X, which is row-independent and computed once per
 *    block while x is staged. The 128 a X parts cancel, so the fma
 *    roundings of s cost the codes' part log2(128 / |q|) bits: the short
 *    codes go in at the byte's top bits (Q3_K's 3 bits: f = 1 + u / 8;
 *    Q2_K's 2: f = 1 + u / 4), else an fp32 output of Q3_K weights had
 *    ~20x the error of a plain fp32 sum. IQ4_XS codes go
 *    through the code book to exact floats (byte permutes, then
 *    2^23 + u - (2^23 + 128)), no X.
 *  - x is staged as fp32 (any token count; the plan sizes the chunk, a
 *    multiple of 256) in planes of 16-byte items indexed by the unit: the
 *    lanes of a wave read consecutive items, free of bank conflicts.
 *  - Reads use the block's alignment (quant.h, nstf_q_align): 16-byte loads
 *    for Q4_K and Q5_K, 8-byte for IQ4_XS, 4-byte for Q2_K, and for the
 *    2-byte aligned Q3_K and Q6_K four words at the 4-aligned address at
 *    or below a 16-byte run plus a 2-byte tail, realigned with a byte
 *    permute per word (Q6_K rows in the GPU's split layout, quant.h: one
 *    aligned 16-byte load per run).
 *  - Each lane keeps UNROLL units of each of its rows in flight (2; 1 at
 *    32-row blocks, from 3 tokens on, and for Q3_K, whose raw unit is 18
 *    words). */
#include "gemv_fused.h"

template <int WT> struct gk_traits {
    static constexpr int NRUN = (WT == GW_Q2_K || WT == GW_Q3_K) ? 4 : 2;
    static constexpr int UPB = 16 / NRUN; /* units per super-block */
    static constexpr int BYTES = WT == GW_Q2_K ? NSTF_Q2_K_BYTES : WT == GW_Q3_K ? NSTF_Q3_K_BYTES
                                 : WT == GW_Q4_K ? NSTF_Q4_K_BYTES : WT == GW_Q5_K ? NSTF_Q5_K_BYTES
                                 : WT == GW_Q6_K ? NSTF_Q6_K_BYTES : NSTF_IQ4_XS_BYTES;
    static constexpr bool NEEDX = WT != GW_IQ4_XS; /* the c0 X term */
    /* raw words of one unit */
    static constexpr int NA = WT == GW_Q4_K ? 8 : WT == GW_Q5_K ? 12 : WT == GW_Q6_K ? 14 : WT == GW_Q3_K ? 17
                              : WT == GW_Q2_K ? 7 : 6;
    /* 2 units in flight at 1-2 tokens; 1 from 3 tokens on, where the
     * accumulators and x fragments of every token already fill the
     * registers (Q2_K at 8 tokens took all 255 and spilled on sm_90a) */
    template <int RPW, int NT> static constexpr int unroll() {
        return (RPW >= 4 || WT == GW_Q3_K || NT >= 3) ? 1 : 2;
    }
};

/* Run rho (0..15: elements 16 rho .. 16 rho + 15 of a super-block) is run
 * r of unit k of that super-block. */
template <int WT> static __device__ __forceinline__ void gk_map(int rho, int &k, int &r) {
    if constexpr (WT == GW_Q4_K || WT == GW_Q5_K) { /* rho = 4j + 2h + k': qs[32j + 16k' + i], nibble h */
        k = 2 * (rho >> 2) + (rho & 1);
        r = (rho >> 1) & 1;
    } else if constexpr (WT == GW_Q6_K) { /* rho = 8n + 4a + 2m + c: ql[64n + 32m + 16c + i], nibble a */
        k = 4 * (rho >> 3) + (rho & 3);
        r = (rho >> 2) & 1;
    } else if constexpr (WT == GW_IQ4_XS) { /* rho = 2b + h: qs[16b + i], nibble h */
        k = rho >> 1;
        r = rho & 1;
    } else { /* Q2_K, Q3_K: rho = 8n + 2j + c: qs[32n + 16c + i], bits 2j */
        k = 2 * (rho >> 3) + (rho & 1);
        r = (rho >> 1) & 3;
    }
}

template <int WT> struct gk_raw {
    uint32_t a[gk_traits<WT>::NA];
};

static __device__ __forceinline__ void gk_put4(uint32_t *a, uint4 v) {
    a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;
}
static __device__ __forceinline__ void gk_put_run(uint32_t *a, const nstf_run16 &r) {
#pragma unroll
    for (int i = 0; i < 5; i++) a[i] = r.w[i];
}

/* The raw bytes of unit u (super-block u / UPB, unit k = u % UPB); nsb:
 * the row's super-block count when it is in the GPU's split layout (Q6_K,
 * quant.h), else 0. */
template <int WT>
static __device__ __forceinline__ gk_raw<WT> gk_load(const uint8_t *__restrict__ row, int u, int nsb) {
    typedef gk_traits<WT> T;
    gk_raw<WT> r;
    const int k = u % T::UPB;
    const uint8_t *b = row + (size_t)(u / T::UPB) * T::BYTES;
    if constexpr (WT == GW_Q4_K) { /* qs 16 B @ 16 + 16k; d, dmin, scales @ 0 */
        gk_put4(r.a, *(const uint4 *)(b + 16 + 16 * k));
        gk_put4(r.a + 4, *(const uint4 *)b);
    } else if constexpr (WT == GW_Q5_K) { /* qs @ 48 + 16k, qh @ 16 + 16 (k & 1) */
        gk_put4(r.a, *(const uint4 *)(b + 48 + 16 * k));
        gk_put4(r.a + 4, *(const uint4 *)(b + 16 + 16 * (k & 1)));
        gk_put4(r.a + 8, *(const uint4 *)b);
    } else if constexpr (WT == GW_Q6_K) { /* k = 4n + 2m + c: ql @ 16k, qh @ 128 + 32n + 16c, scales @ 192 + ..., d @ 208 */
        const int n = k >> 2, m = (k >> 1) & 1, c = k & 1;
        if (nsb) { /* codes @ 192 sb, scales @ 192 nsb + 16 sb, d after them; the runs aligned */
            const size_t sb = (size_t)(u / T::UPB);
            const uint8_t *bq = row + 192 * sb, *sc = row + 192 * (size_t)nsb + 16 * sb;
            gk_put4(r.a, *(const uint4 *)(bq + 16 * k));
            gk_put4(r.a + 5, *(const uint4 *)(bq + 128 + 32 * n + 16 * c));
            r.a[4] = r.a[9] = 0;
            r.a[10] = sc[8 * n + 2 * m + c];
            r.a[11] = sc[4 + 8 * n + 2 * m + c];
            r.a[12] = nstf_ld_u16(row + 208 * (size_t)nsb + 2 * sb);
            r.a[13] = 0;
            return r;
        }
        gk_put_run(r.a, nstf_ld_run16_a2(b + 16 * k));
        gk_put_run(r.a + 5, nstf_ld_run16_a2(b + 128 + 32 * n + 16 * c));
        r.a[10] = b[192 + 8 * n + 2 * m + c];
        r.a[11] = b[196 + 8 * n + 2 * m + c];
        r.a[12] = nstf_ld_u16(b + 208);
        r.a[13] = (uint32_t)((uintptr_t)b & 2);
    } else if constexpr (WT == GW_Q3_K) { /* k = 2n + c: hmask @ 16c, qs @ 32 + 16k, scales[12] @ 96, d @ 108 */
        gk_put_run(r.a, nstf_ld_run16_a2(b + 16 * (k & 1)));
        gk_put_run(r.a + 5, nstf_ld_run16_a2(b + 32 + 16 * k));
#pragma unroll
        for (int i = 0; i < 6; i++) r.a[10 + i] = nstf_ld_u16(b + 96 + 2 * i);
        r.a[16] = nstf_ld_u16(b + 108) | ((uint32_t)((uintptr_t)b & 2) << 16);
    } else if constexpr (WT == GW_Q2_K) { /* k = 2n + c: qs @ 16 + 16k, scales @ 8n (8 bytes), d | dmin @ 80 */
#pragma unroll
        for (int i = 0; i < 4; i++) r.a[i] = nstf_ld_u32(b + 16 + 16 * k + 4 * i);
        r.a[4] = nstf_ld_u32(b + 8 * (k >> 1));
        r.a[5] = nstf_ld_u32(b + 8 * (k >> 1) + 4);
        r.a[6] = nstf_ld_u32(b + 80);
    } else { /* IQ4_XS, k = sub-block: qs @ 8 + 16k; d, scales_h, scales_l @ 0 */
        const uint2 q0 = *(const uint2 *)(b + 8 + 16 * k), q1 = *(const uint2 *)(b + 16 + 16 * k);
        const uint2 h = *(const uint2 *)b;
        r.a[0] = q0.x, r.a[1] = q0.y, r.a[2] = q1.x, r.a[3] = q1.y, r.a[4] = h.x, r.a[5] = h.y;
    }
    return r;
}

/* Run r of unit k: the 16 code floats wv (in element order) and the run's
 * c1, c0: sum over the run of w x = c1 * sum wv x + c0 * X. */
template <int WT>
static __device__ __forceinline__ void gk_decode(const gk_raw<WT> &raw, int k, int r, float (&wv)[16], float &c1,
                                                 float &c0) {
    const uint32_t *a = raw.a;
    if constexpr (WT == GW_Q4_K || WT == GW_Q5_K) {
        const uint32_t *hd = a + (WT == GW_Q5_K ? 8 : 4); /* d | dmin, scales 0-3, 4-7, 8-11 */
        const int s = 2 * (k >> 1) + r;                    /* sub-block */
        uint32_t sc, m;
        if (s < 4) {
            sc = nstf_byte_of(hd[1], s) & 63;
            m = nstf_byte_of(hd[2], s) & 63;
        } else {
            const uint32_t q8 = nstf_byte_of(hd[3], s - 4);
            sc = (q8 & 0xf) | ((nstf_byte_of(hd[1], s - 4) >> 6) << 4);
            m = (q8 >> 4) | ((nstf_byte_of(hd[2], s - 4) >> 6) << 4);
        }
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint32_t q = ((a[w] >> (4 * r)) & 0x0f0f0f0fu) | 0x80808080u;
            if constexpr (WT == GW_Q5_K) q |= ((a[4 + w] >> s) & 0x01010101u) << 4;
#pragma unroll
            for (int e = 0; e < 4; e++) wv[4 * w + e] = nstf_byte_1p(q, e);
        }
        c1 = 128.0f * (nstf_h2f(hd[0]) * (float)sc);
        c0 = -fmaf(nstf_h2f(hd[0] >> 16), (float)m, c1);
    } else if constexpr (WT == GW_Q6_K) {
        const uint32_t mis = a[13];
        const int sh = 2 * ((k >> 1) & 1) + 4 * r; /* bits 2 (m + 2a) of qh */
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const uint32_t ql = nstf_run16_word(a, w, mis);
            const uint32_t qh = nstf_run16_word(a + 5, w, mis);
            const uint32_t q = ((ql >> (4 * r)) & 0x0f0f0f0fu) | (((qh >> sh) & 0x03030303u) << 4) | 0x80808080u;
#pragma unroll
            for (int e = 0; e < 4; e++) wv[4 * w + e] = nstf_byte_1p(q, e);
        }
        const float ds = nstf_h2f(a[12]) * (float)(int8_t)(r ? a[11] : a[10]);
        c1 = 128.0f * ds;
        c0 = -160.0f * ds; /* q - 32 = 128 f - 160 */
    } else if constexpr (WT == GW_Q3_K) {
        const uint32_t mis = a[16] >> 16;
        const int n = k >> 1, c = k & 1;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const uint32_t hm = nstf_run16_word(a, w, mis);
            const uint32_t qs = nstf_run16_word(a + 5, w, mis);
            /* the 3-bit code u at bits 4..6: f = 1 + u / 8 (not 1 + u / 128),
             * so the 1 that cancels against X costs 3 bits, not 7 */
            const uint32_t u3 = ((qs >> (2 * r)) & 0x03030303u) | (((hm >> (4 * n + r)) & 0x01010101u) << 2);
            const uint32_t q = (u3 << 4) | 0x80808080u;
#pragma unroll
            for (int e = 0; e < 4; e++) wv[4 * w + e] = nstf_byte_1p(q, e);
        }
        /* scale i = 8n + 2r + c: low nibble of byte i % 8 (the high one for
         * n = 1), two bits of byte 8 + i % 4 at 2 (i / 4) */
        const int i8 = 2 * r + c;
        const uint32_t s_lo = i8 < 4 ? (a[10] | (a[11] << 16)) : (a[12] | (a[13] << 16));
        const uint32_t s_hi = a[14] | (a[15] << 16);
        const int lo = (int)((nstf_byte_of(s_lo, i8 & 3) >> (4 * n)) & 0xf);
        const int hi = (int)((nstf_byte_of(s_hi, i8 & 3) >> (2 * (2 * n + (r >> 1)))) & 3);
        const float ds = nstf_h2f(a[16]) * (float)((lo | (hi << 4)) - 32);
        c1 = 8.0f * ds;
        c0 = -12.0f * ds; /* q = u - 4 = 8 f - 12; both products exact */
    } else if constexpr (WT == GW_Q2_K) {
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const uint32_t q = (((a[w] >> (2 * r)) & 0x03030303u) << 5) | 0x80808080u; /* f = 1 + u / 4 */
#pragma unroll
            for (int e = 0; e < 4; e++) wv[4 * w + e] = nstf_byte_1p(q, e);
        }
        const int bi = (k & 1) + 2 * r; /* scales[8n + c + 2r]: byte bi of the 8 loaded */
        const uint32_t s = nstf_byte_of(bi < 4 ? a[4] : a[5], bi & 3);
        c1 = 4.0f * (nstf_h2f(a[6]) * (float)(s & 0xf));
        c0 = -fmaf(nstf_h2f(a[6] >> 16), (float)(s >> 4), c1);
    } else { /* IQ4_XS */
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const uint32_t v = nstf_iq4_lookup4((a[w] >> (4 * r)) & 0x0f0f0f0fu);
#pragma unroll
            for (int e = 0; e < 4; e++) wv[4 * w + e] = nstf_byte_2p23(v, e) - 8388736.0f;
        }
        const int ls =
            (int)(((nstf_byte_of(a[5], k >> 1) >> (4 * (k & 1))) & 0xf) | (((a[4] >> (16 + 2 * k)) & 3) << 4));
        c1 = nstf_h2f(a[4]) * (float)(ls - 32);
        c0 = 0.0f;
    }
}

template <int WT, int NT, bool Y_BF16, int ROWS, int FZ>
__global__ void __launch_bounds__(GEMV_THREADS)
gemvk_kernel(const uint8_t *__restrict__ w, size_t row_bytes, const uint16_t *__restrict__ x,
             void *__restrict__ y, int n_in, int n_out, int chunk, int x_vec, const gemv_fz f) {
    typedef gk_traits<WT> T;
    constexpr int NRUN = T::NRUN;
    extern __shared__ uint4 gemv_smem[];
    __shared__ float fz_sh[ROWS > 32 ? ROWS : 32];
    static_assert(FZ == 0 || NT == 1, "fused GEMVs are one token");
    float *xs32 = (float *)gemv_smem;           /* [NT][chunk] fp32, plane layout */
    float *xsum = xs32 + NT * chunk;            /* [NT][NRUN][chunk / (16 NRUN)] */
    constexpr int N_WAVES = GEMV_THREADS / NSTF_WAVE;
    constexpr int RPW = ROWS / N_WAVES;
    constexpr int UNROLL = T::template unroll<RPW, NT>();
    static_assert(RPW >= 1 && RPW * N_WAVES == ROWS, "ROWS must be a multiple of the waves per block");
    const int lane = threadIdx.x % NSTF_WAVE;
    int rowv[RPW];
    const uint8_t *wr[RPW];
    gemv_row_ptrs<FZ, ROWS>(rowv, wr, w, row_bytes, n_out, f, NT == 1);
    const int units_per_chunk = chunk / (16 * NRUN);
    /* one token, one chunk: the first unit of each row loaded before the wait */
    const bool pre_on = NT == 1 && RPW <= 2 && !f.no_pre && chunk >= n_in && lane < n_in / (16 * NRUN);
    /* Q6_K rows in the GPU's split layout (quant.h), told by the row length */
    const int nsb = WT == GW_Q6_K && nstf_gpu_split_q6k(NSTF_TYPE_Q6_K, n_in) ? n_in / 256 : 0;
    gk_raw<WT> pre[RPW];
    if (pre_on) {
#pragma unroll
        for (int r = 0; r < RPW; r++) pre[r] = gk_load<WT>(wr[r], lane, nsb);
    }
    const float rn = fz_begin<FZ>(f, n_in, fz_sh);

    float acc[RPW][NT];
    gemv_acc_zero(acc);

    const int nu = units_per_chunk; /* plane length (items) */
    for (int c0 = 0; c0 < n_in; c0 += chunk) {
        const int len = min(chunk, n_in - c0); /* a multiple of 256 */
        const int n_units = len / (16 * NRUN);
        __syncthreads(); /* the previous chunk is consumed */
        /* stage 8 elements at a time: element e -> run rho of super-block
         * e / 256 -> (unit, run) -> planes 4 run + (e % 16) / 4 */
        for (int t = 0; t < NT; t++) {
            for (int i = threadIdx.x * 8; i < len; i += GEMV_THREADS * 8) {
                float v[8];
                gemv_x8<FZ>(f, x + (size_t)t * n_in + c0, i, x_vec, rn, v);
                int k, r;
                gk_map<WT>((i >> 4) & 15, k, r);
                const int u = (i >> 8) * T::UPB + k, q0 = 4 * r + ((i & 15) >> 2);
                float4 *d = (float4 *)(xs32 + (size_t)t * chunk);
                d[q0 * nu + u] = make_float4(v[0], v[1], v[2], v[3]);
                d[(q0 + 1) * nu + u] = make_float4(v[4], v[5], v[6], v[7]);
            }
        }
        __syncthreads();
        if (T::NEEDX) {
            for (int i = threadIdx.x; i < NT * NRUN * n_units; i += GEMV_THREADS) {
                const int t = i / (NRUN * n_units), ru = i - t * (NRUN * n_units), r = ru / n_units,
                          u = ru - r * n_units;
                const float4 *p = (const float4 *)(xs32 + (size_t)t * chunk);
                float s = 0.0f;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float4 v = p[(4 * r + q) * nu + u];
                    s += v.x;
                    s += v.y;
                    s += v.z;
                    s += v.w;
                }
                xsum[(t * NRUN + r) * nu + u] = s;
            }
            __syncthreads();
        }
        const int ubase = c0 / (16 * NRUN); /* units before this chunk (whole super-blocks) */
        for (int u0 = lane; u0 < n_units; u0 += NSTF_WAVE * UNROLL) {
            gk_raw<WT> raw[UNROLL][RPW];
#pragma unroll
            for (int kk = 0; kk < UNROLL; kk++) {
                const int u = u0 + kk * NSTF_WAVE;
                if (u < n_units) {
                    const bool from_pre = kk == 0 && pre_on && u0 == lane;
#pragma unroll
                    for (int r = 0; r < RPW; r++) raw[kk][r] = from_pre ? pre[r] : gk_load<WT>(wr[r], ubase + u, nsb);
                }
            }
#pragma unroll
            for (int kk = 0; kk < UNROLL; kk++) {
                const int u = u0 + kk * NSTF_WAVE;
                if (u >= n_units) break;
                const int ku = u % T::UPB; /* chunks start on super-blocks */
#pragma unroll
                for (int run = 0; run < NRUN; run++) {
                    float wv[RPW][16], c1[RPW], cx[RPW];
#pragma unroll
                    for (int r = 0; r < RPW; r++) gk_decode<WT>(raw[kk][r], ku, run, wv[r], c1[r], cx[r]);
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        const float4 *p = (const float4 *)(xs32 + (size_t)t * chunk);
                        float xf[16];
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            const float4 v = p[(4 * run + q) * nu + u];
                            xf[4 * q] = v.x, xf[4 * q + 1] = v.y, xf[4 * q + 2] = v.z, xf[4 * q + 3] = v.w;
                        }
                        const float X = T::NEEDX ? xsum[(t * NRUN + run) * nu + u] : 0.0f;
#pragma unroll
                        for (int r = 0; r < RPW; r++) {
                            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                            for (int e = 0; e < 8; e++) {
                                s0 = fmaf(wv[r][e], xf[e], s0);
                                s1 = fmaf(wv[r][8 + e], xf[8 + e], s1);
                            }
                            float a2 = acc[r][t];
                            if (T::NEEDX) a2 = fmaf(cx[r], X, a2);
                            acc[r][t] = fmaf(c1[r], s0 + s1, a2);
                        }
                    }
                }
            }
        }
    }
    gemv_finish<FZ, NT, Y_BF16, ROWS>(acc, rowv, y, n_out, f, fz_sh, lane);
}

/* ---- instances ------------------------------------------------------------ */

struct gemvk_k {
    template <int WT, int NT, bool YB, int R, int FZ> static gemv_fn fn() {
        if constexpr (NT == 1 && (WT == GW_Q4_K || WT == GW_Q5_K || WT == GW_Q6_K || WT == GW_IQ4_XS))
            return nullptr; /* gemvk_i8.cu's */
        else return gemvk_kernel<WT, NT, YB, R, FZ>;
    }
    template <bool YB, int R> static gemv_fn pick(int wt, int nt) {
        switch (wt) {
        case GW_Q2_K: return gemv_pick_nt<gemvk_k, GW_Q2_K, YB, R>(nt);
        case GW_Q3_K: return gemv_pick_nt<gemvk_k, GW_Q3_K, YB, R>(nt);
        case GW_Q4_K: return gemv_pick_nt<gemvk_k, GW_Q4_K, YB, R>(nt);
        case GW_Q5_K: return gemv_pick_nt<gemvk_k, GW_Q5_K, YB, R>(nt);
        case GW_Q6_K:
        case GW_Q6_KS: return gemv_pick_nt<gemvk_k, GW_Q6_K, YB, R>(nt); /* the kernel tells the layout from n_in */
        default: return gemv_pick_nt<gemvk_k, GW_IQ4_XS, YB, R>(nt);
        }
    }
};

gemv_fn nstf_gemvk_pick(int wt, int nt, int rows, bool y_bf16) { return gemv_pick_plain<gemvk_k>(wt, nt, rows, y_bf16); }

/* No fused instances here: Q4_K, Q5_K, Q6_K (the types of the Q4_K_M,
 * Q5_K_M and Q6_K files) and IQ4_XS fuse in gemvk_i8.cu; the rarer Q2_K and
 * Q3_K run unfused (nstf_gpu_gemv_fusable says no). The size of gemv_fz
 * this file was built with still guards against a stale object. */
int nstf_gemvk_fz_bytes(void) { return (int)sizeof(gemv_fz); }
