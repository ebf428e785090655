/* gemvk_i8.cu — one token's GEMV on integer dot products (dp4a / v_dot4)
 * for Q4_K, Q5_K and Q6_K (the Q4_K_M, Q5_K_M and Q6_K files' types),
 * IQ4_XS, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL:
 * plain and fused instances (gemv_fused.h's frame: row slots, the norm
 * prologue, the epilogues, the PDL wait and early loads); gemvk.cu and
 * gemvq.cu keep the float kernels for more tokens and the other types.
 * Studied in bench/kernels/gemv/gemv_k_v1.cu (numbers in docs/PERFORMANCE.md).
 *
 *  - x is staged once per block as 16-bit fixed point per 32 elements:
 *    dx = max|x| / 32639 and q = round(x / dx) = 256 hi + lo, two int8
 *    planes, plus per 32 the pair (dx, fp32 sum of x) for the offsets and
 *    mins. |x - dx q| <= max|x| / 65278: finer than the bf16 x itself.
 *  - Work goes by groups of 256 elements: a super-block, or 8 blocks of a
 *    32-element type. A wave's lanes take 8 per group (NSTF_WAVE / 8
 *    groups per step): lane c reads 16 bytes of codes holding two runs of
 *    16 elements (low and high nibbles; the 32-element types: block c of
 *    the group, Q8_0's 32 codes as two runs of 16 bytes, Q5_0 / Q5_1's
 *    fifth bits from the block's qh word; IQ4_XS: sub-block c; IQ4_NL and
 *    IQ4_XS map their codes through the code book, nstf_iq4_lookup4).
 *    The planes are stored permuted so that lane c's runs are bytes 16 c
 *    and 128 + 16 c of the group's 256: consecutive lanes read consecutive
 *    16 bytes (no bank conflicts).
 *  - Per 4 codes two dot4 (hi and lo plane), exact in int32; per run one
 *    conversion and fma with the scale and dx; offsets and mins through the
 *    fp32 sums of x.
 *  - Q4_K blocks (144 bytes) are 16-byte aligned: one 16-byte load of
 *    codes and one of the header (d, dmin, scales) per lane and row; Q5_K
 *    (176 bytes) the same plus 16 bytes of high bits (the 16 bytes of qh a
 *    lane needs are shared by the 4 lanes of its half: those go through
 *    L1, the codes do not); IQ4_XS (136 bytes) is 8-byte aligned: two
 *    8-byte loads of codes and one of the header (d, scales). Q6_K
 *    (210 bytes), Q4_0 / IQ4_NL (18) and Q5_0 (22) blocks are 2-byte
 *    aligned: runs load as five words and realign (quant.h); Q4_1 (20) and
 *    Q5_1 (24) as four words. Q4_0, IQ4_NL and Q8_0 rows in the GPU's
 *    split layout (GW_Q4_0S, GW_IQ4_NLS, GW_Q8_0S; quant.h) load their 16
 *    (Q8_0: 32) bytes of codes in 16-byte loads that bypass L1, and the
 *    scale apart; Q6_K rows in the split layout (GW_Q6_KS) their ql and
 *    qh runs in aligned 16-byte loads, the scales and d apart.
 *  - A wave owns RPW rows and keeps UNR steps of them in flight; the first
 *    steps are loaded before the PDL wait. Rows past the end re-read the
 *    last row and are never stored. */
#include "gemv_fused.h"

template <int WT> struct gk8_traits {
    static constexpr bool Q6 = WT == GW_Q6_K || WT == GW_Q6_KS; /* either layout */
    static constexpr bool SUPER = WT == GW_Q4_K || WT == GW_Q5_K || Q6 || WT == GW_IQ4_XS; /* a group is one block */
    static constexpr int BYTES = WT == GW_Q4_K ? NSTF_Q4_K_BYTES : WT == GW_Q5_K ? NSTF_Q5_K_BYTES
                                 : Q6 ? NSTF_Q6_K_BYTES : WT == GW_IQ4_XS ? NSTF_IQ4_XS_BYTES
                                 : WT == GW_Q8_0 ? NSTF_Q8_0_BYTES : WT == GW_Q4_0 ? NSTF_Q4_0_BYTES
                                 : WT == GW_Q4_1 ? NSTF_Q4_1_BYTES : WT == GW_Q5_0 ? NSTF_Q5_0_BYTES
                                 : WT == GW_Q5_1 ? NSTF_Q5_1_BYTES : WT == GW_Q4_0S ? NSTF_Q4_0_BYTES
                                 : WT == GW_Q8_0S ? NSTF_Q8_0_BYTES : NSTF_IQ4_NL_BYTES;
    static constexpr int SBW = NSTF_WAVE / 8; /* groups per wave step */
    static constexpr int NA = WT == GW_Q4_K ? 8 : WT == GW_Q5_K ? 12 : Q6 || WT == GW_Q8_0 ? 11
                              : WT == GW_Q8_0S ? 9 : WT == GW_Q5_0 ? 7
                              : WT == GW_Q4_0 || WT == GW_IQ4_XS || WT == GW_IQ4_NL || WT == GW_Q5_1 || GW_SPLIT(WT) ? 6
                              : 5; /* raw words */
    /* the 32-element types whose codes are 2-byte aligned runs (realigned) */
    static constexpr bool A2 = WT == GW_Q4_0 || WT == GW_Q5_0 || WT == GW_IQ4_NL;
};

/* Sum of the four signed byte products of a and b, plus c. */
static __device__ __forceinline__ int gk8_dot4(uint32_t a, uint32_t b, int c) {
#if defined(__HIP_PLATFORM_AMD__)
#if defined(__gfx11__) || defined(__gfx12__)
    return __builtin_amdgcn_sudot4(true, (int)a, true, (int)b, c, false);
#elif defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
    return __builtin_amdgcn_sdot4((int)a, (int)b, c, false);
#else
#pragma unroll
    for (int e = 0; e < 4; e++) c += (int)(int8_t)(a >> (8 * e)) * (int)(int8_t)(b >> (8 * e));
    return c;
#endif
#else
    return __dp4a((int)a, (int)b, c);
#endif
}

/* 16 bytes of weights: read once, so not kept in L1 where x is (sm_90). */
static __device__ __forceinline__ uint4 gk8_ld_w(const uint8_t *p) {
#if defined(NSTF_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#else
    return *(const uint4 *)p;
#endif
}

/* Where element e (0..255) of a group sits in the permuted planes. */
template <int WT> static __device__ __forceinline__ int gk8_pos(int e) {
    int c, hi;
    if constexpr (WT == GW_Q4_K || WT == GW_Q5_K) { /* lane c = 2p + h holds 64p + 16h + i (low) and + 32 (high) */
        c = 2 * (e >> 6) + ((e >> 4) & 1);
        hi = (e >> 5) & 1;
    } else if constexpr (gk8_traits<WT>::Q6) { /* lane c = 4n + g holds 128n + 16g + i (low) and + 64 (high) */
        c = 4 * (e >> 7) + ((e >> 4) & 3);
        hi = (e >> 6) & 1;
    } else { /* the 32-element types: lane c holds block c, IQ4_XS sub-block c: 32c + i (low) and + 16 (high) */
        c = e >> 5;
        hi = (e >> 4) & 1;
    }
    return 128 * hi + 16 * c + (e & 15);
}

/* The raw bytes of one lane's unit of one row. */
template <int WT> struct gk8_raw {
    uint32_t a[gk8_traits<WT>::NA];
};

/* Lane c's unit of group g of a row: super-block g's codes 16c.., or
 * block 8g + c. */
template <int WT>
static __device__ __forceinline__ gk8_raw<WT> gk8_load(const uint8_t *__restrict__ row, int g, int c, int nb) {
    gk8_raw<WT> r;
    if constexpr (GW_SPLIT(WT)) { /* the row's nb scales, then its runs of 16 (Q8_0: 32) codes (quant.h) */
        const int b = 8 * g + c;
        constexpr int CB = gk8_traits<WT>::BYTES - 2;
        const uint4 q = gk8_ld_w(row + 2 * (size_t)nb + (size_t)CB * b);
        r.a[0] = q.x, r.a[1] = q.y, r.a[2] = q.z, r.a[3] = q.w;
        if constexpr (CB == 32) {
            const uint4 q1 = gk8_ld_w(row + 2 * (size_t)nb + (size_t)CB * b + 16);
            r.a[4] = q1.x, r.a[5] = q1.y, r.a[6] = q1.z, r.a[7] = q1.w;
            r.a[8] = nstf_ld_u16(row + 2 * b);
        } else {
            r.a[4] = 0;
            r.a[5] = nstf_ld_u16(row + 2 * b);
        }
    } else if constexpr (WT == GW_Q4_K) {
        const uint8_t *b = row + (size_t)g * NSTF_Q4_K_BYTES;
        const uint4 q = gk8_ld_w(b + 16 + 16 * c), h = *(const uint4 *)b;
        r.a[0] = q.x, r.a[1] = q.y, r.a[2] = q.z, r.a[3] = q.w;
        r.a[4] = h.x, r.a[5] = h.y, r.a[6] = h.z, r.a[7] = h.w;
    } else if constexpr (WT == GW_Q5_K) { /* d, dmin, scales @ 0; qh @ 16; qs @ 48: lane c = 2p + h reads qs @
                                             48 + 16c and qh @ 16 + 16h (bits 2p and 2p + 1 are its codes') */
        const uint8_t *b = row + (size_t)g * NSTF_Q5_K_BYTES;
        const uint4 q = gk8_ld_w(b + 48 + 16 * c), h = *(const uint4 *)b, qh = *(const uint4 *)(b + 16 + 16 * (c & 1));
        r.a[0] = q.x, r.a[1] = q.y, r.a[2] = q.z, r.a[3] = q.w;
        r.a[4] = h.x, r.a[5] = h.y, r.a[6] = h.z, r.a[7] = h.w;
        r.a[8] = qh.x, r.a[9] = qh.y, r.a[10] = qh.z, r.a[11] = qh.w;
    } else if constexpr (WT == GW_Q6_KS) { /* split rows (quant.h), nb / 8 super-blocks: ql @ 192 g + 64n + 16g',
                                              qh @ 192 g + 128 + 32n + 16(g' & 1), scales @ 192 nb / 8 + 16 g, d after them */
        const size_t nsb = (size_t)nb / 8;
        const uint8_t *b = row + (size_t)g * 192, *sc = row + 192 * nsb + 16 * (size_t)g;
        const int n = c >> 2, gg = c & 3;
        const uint4 ql = gk8_ld_w(b + 64 * n + 16 * gg), qh = *(const uint4 *)(b + 128 + 32 * n + 16 * (gg & 1));
        r.a[0] = ql.x, r.a[1] = ql.y, r.a[2] = ql.z, r.a[3] = ql.w, r.a[4] = 0;
        r.a[5] = qh.x, r.a[6] = qh.y, r.a[7] = qh.z, r.a[8] = qh.w, r.a[9] = 0;
        r.a[10] = sc[8 * n + gg] | ((uint32_t)sc[4 + 8 * n + gg] << 8) | (nstf_ld_u16(row + 208 * nsb + 2 * (size_t)g) << 16);
    } else if constexpr (WT == GW_Q6_K) { /* c = 4n + g: ql @ 64n + 16g, qh @ 128 + 32n + 16(g & 1), scales @ 192, d @ 208 */
        const uint8_t *b = row + (size_t)g * NSTF_Q6_K_BYTES;
        const int n = c >> 2, gg = c & 3;
        const nstf_run16 ql = nstf_ld_run16_a2(b + 64 * n + 16 * gg), qh = nstf_ld_run16_a2(b + 128 + 32 * n + 16 * (gg & 1));
#pragma unroll
        for (int k = 0; k < 5; k++) r.a[k] = ql.w[k], r.a[5 + k] = qh.w[k];
        /* the two scales (int8) in bytes 0 and 1, d in the high half */
        r.a[10] = b[192 + 8 * n + gg] | ((uint32_t)b[196 + 8 * n + gg] << 8) | (nstf_ld_u16(b + 208) << 16);
    } else if constexpr (WT == GW_IQ4_XS) { /* d, scales_h, scales_l @ 0; qs @ 8 + 16c: sub-block c */
        const uint8_t *b = row + (size_t)g * NSTF_IQ4_XS_BYTES;
        const uint2 q0 = *(const uint2 *)(b + 8 + 16 * c), q1 = *(const uint2 *)(b + 16 + 16 * c), h = *(const uint2 *)b;
        r.a[0] = q0.x, r.a[1] = q0.y, r.a[2] = q1.x, r.a[3] = q1.y;
        r.a[4] = h.x, r.a[5] = h.y;
    } else if constexpr (WT == GW_Q8_0) { /* d @ 0, qs @ 2: codes 0..15 and 16..31 as two runs */
        const uint8_t *b = row + (size_t)(8 * g + c) * NSTF_Q8_0_BYTES;
        const nstf_run16 lo = nstf_ld_run16_a2(b + 2), hi = nstf_ld_run16_a2(b + 18);
#pragma unroll
        for (int k = 0; k < 5; k++) r.a[k] = lo.w[k], r.a[5 + k] = hi.w[k];
        r.a[10] = nstf_ld_u16(b) | ((uint32_t)((uintptr_t)(b + 2) & 2) << 15); /* d; bit 16: the runs are 2 mod 4 */
    } else if constexpr (WT == GW_Q4_0 || WT == GW_IQ4_NL || WT == GW_Q5_0) { /* d @ 0, qs @ 2 (Q5_0: qh @ 2, qs @ 6) */
        const uint8_t *b = row + (size_t)(8 * g + c) * gk8_traits<WT>::BYTES;
        constexpr int QS = WT == GW_Q5_0 ? 6 : 2;
        const nstf_run16 q = nstf_ld_run16_a2(b + QS);
#pragma unroll
        for (int k = 0; k < 5; k++) r.a[k] = q.w[k];
        r.a[5] = nstf_ld_u16(b) | ((uint32_t)((uintptr_t)(b + QS) & 2) << 15); /* d; bit 16: the run is 2 mod 4 */
        if constexpr (WT == GW_Q5_0) r.a[6] = nstf_ld_u16(b + 2) | (nstf_ld_u16(b + 4) << 16);
    } else { /* Q4_1 / Q5_1, 4-byte aligned: d | m @ 0, qs @ 4 (Q5_1: qh @ 4, qs @ 8) */
        const uint8_t *b = row + (size_t)(8 * g + c) * gk8_traits<WT>::BYTES;
        constexpr int QS = WT == GW_Q5_1 ? 8 : 4;
#pragma unroll
        for (int k = 0; k < 4; k++) r.a[k] = nstf_ld_u32(b + QS + 4 * k);
        r.a[4] = nstf_ld_u32(b);
        if constexpr (WT == GW_Q5_1) r.a[5] = nstf_ld_u32(b + 4);
    }
    return r;
}

template <int WT, bool Y_BF16, int ROWS, int FZ>
__global__ void __launch_bounds__(GEMV_THREADS)
gemvk8_kernel(const uint8_t *__restrict__ w, size_t row_bytes, const uint16_t *__restrict__ x,
              void *__restrict__ y, int n_in, int n_out, int chunk, int x_vec, const gemv_fz f) {
    typedef gk8_traits<WT> T;
    constexpr int SBW = T::SBW;
    extern __shared__ uint4 gemv_smem[];
    __shared__ float fz_sh[ROWS > 32 ? ROWS : 32];
    int8_t *xhs = (int8_t *)gemv_smem;     /* [chunk], permuted per group of 256 */
    int8_t *xls = xhs + chunk;             /* [chunk] */
    float2 *dss = (float2 *)(xls + chunk); /* [chunk / 32]: dx, sum */
    constexpr int N_WAVES = GEMV_THREADS / NSTF_WAVE;
    constexpr int RPW = ROWS / N_WAVES;
    constexpr int UNR = RPW >= 4 ? 1 : 2;
    static_assert(RPW >= 1 && RPW * N_WAVES == ROWS, "ROWS must be a multiple of the waves per block");
    const int lane = threadIdx.x % NSTF_WAVE;
    const int sbl = lane >> 3, c = lane & 7;
    int rowv[RPW];
    const uint8_t *wr[RPW];
    gemv_row_ptrs<FZ, ROWS>(rowv, wr, w, row_bytes, n_out, f, true);

    /* lane c's unit of group g holds data when its first element is below e_end */
    auto unit_in = [&](int g, int e_end) { return T::SUPER ? 256 * g < e_end : 32 * (8 * g + c) < e_end; };
    gk8_raw<WT> raw[UNR][RPW];
    auto load_batch = [&](int g0, int e_end) { /* g0, e_end: from the row's start */
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int g = g0 + u * SBW + sbl;
            if (unit_in(g, e_end)) {
#pragma unroll
                for (int r = 0; r < RPW; r++) raw[u][r] = gk8_load<WT>(wr[r], g, c, n_in / 32);
            }
        }
    };
    const int e0 = min(n_in, chunk);
    if (!f.no_pre) load_batch(0, e0); /* constant data: before the PDL wait */
    const float rn = fz_begin<FZ>(f, n_in, fz_sh);
    if (f.no_pre) load_batch(0, e0);

    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) acc[r] = 0.0f;
    for (int c0 = 0; c0 < n_in; c0 += chunk) { /* chunk: a multiple of 256 */
        const int len = min(chunk, n_in - c0); /* a multiple of the block */
        const int gbase = c0 / 256, ng = (len + 255) / 256;
        if (c0) __syncthreads(); /* the previous chunk is consumed */
        /* stage 8 elements per thread and pass, 4 lanes per 32; whole
         * groups, so every wave's pass is whole (zeros past len). The
         * loads of XP passes go out before any is used: x is read from
         * L2 once per block, and one round trip per pass was the largest
         * part of staging the 14,336 inputs of the 8B down projection. The
         * types of 7 raw words or fewer take 4 passes in blocks of 8 rows
         * (one per wave), else 2 (rows of 4096 in one round); the others
         * keep 1: their registers cost more than the loads gain (Q8_0's
         * down projection lost 14% at 4 on the H100). Q5_1 keeps 1 too: at
         * 4 its 8-row instances spill on sm_90a (the ISA gates). */
        constexpr int XP = T::NA <= 7 && WT != GW_Q5_1 ? (RPW == 1 ? 4 : 2) : 1, PASS = GEMV_THREADS * 8;
        for (int i0 = threadIdx.x * 8; i0 < 256 * ng; i0 += XP * PASS) {
            float vp[XP][8];
#pragma unroll
            for (int p = 0; p < XP; p++) {
                const int i = i0 + p * PASS;
#pragma unroll
                for (int o = 0; o < 8; o++) vp[p][o] = 0.0f;
                if (i < len) gemv_x8<FZ>(f, x + c0, i, x_vec, rn, vp[p]);
            }
#pragma unroll
            for (int p = 0; p < XP; p++) {
                const int i = i0 + p * PASS;
                if (i >= 256 * ng) break; /* the same for the whole wave */
                const float(&v)[8] = vp[p];
                float amax = 0.0f, sum = 0.0f;
#pragma unroll
                for (int o = 0; o < 8; o++) {
                    amax = fmaxf(amax, fabsf(v[o]));
                    sum += v[o];
                }
                /* the 4 lanes of this 32: lanes 4k .. 4k + 3 */
                amax = fmaxf(amax, NSTF_SHFL_XOR(amax, 1));
                amax = fmaxf(amax, NSTF_SHFL_XOR(amax, 2));
                sum += NSTF_SHFL_XOR(sum, 1);
                sum += NSTF_SHFL_XOR(sum, 2);
                const float inv = amax > 0.0f ? 32639.0f / amax : 0.0f;
                /* q = round(v inv) with |q| <= 32639 as the low bits of v inv +
                 * 1.5 2^23 (round to nearest even, as a conversion would, but
                 * an add instead of a slow conversion): b = 0x4B400000 + q. The
                 * planes are q = 256 hi + lo, lo in -128..127: lo is q's low
                 * byte, hi the second byte of q + 128; four bytes gather in
                 * three byte permutes. */
                uint32_t b[8], h[8], hw[2], lw[2];
#pragma unroll
                for (int o = 0; o < 8; o++) {
                    b[o] = __float_as_uint(__fadd_rn(__fmul_rn(v[o], inv), 12582912.0f));
                    h[o] = b[o] + 128u;
                }
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    lw[k] = __byte_perm(__byte_perm(b[4 * k], b[4 * k + 1], 0x0040u),
                                        __byte_perm(b[4 * k + 2], b[4 * k + 3], 0x0040u), 0x5410u);
                    hw[k] = __byte_perm(__byte_perm(h[4 * k], h[4 * k + 1], 0x0051u),
                                        __byte_perm(h[4 * k + 2], h[4 * k + 3], 0x0051u), 0x5410u);
                }
                const int at = (i & ~255) + gk8_pos<WT>(i & 255);
                *(uint2 *)(xhs + at) = make_uint2(hw[0], hw[1]);
                *(uint2 *)(xls + at) = make_uint2(lw[0], lw[1]);
                if ((i & 31) == 0) dss[i / 32] = make_float2(amax / 32639.0f, sum);
            }
        }
        __syncthreads();
        for (int s0 = 0; s0 < ng; s0 += UNR * SBW) {
            if (c0 || s0) load_batch(gbase + s0, c0 + len);
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const int gc = s0 + u * SBW + sbl; /* group within the chunk */
                if (!unit_in(gc, len)) continue;
                const int8_t *ph = xhs + 256 * gc + 16 * c, *pl = xls + 256 * gc + 16 * c;
                const uint4 xa = *(const uint4 *)ph, xb = *(const uint4 *)(ph + 128);
                const uint4 la = *(const uint4 *)pl, lb = *(const uint4 *)(pl + 128);
                const uint32_t xav[4] = {xa.x, xa.y, xa.z, xa.w}, xbv[4] = {xb.x, xb.y, xb.z, xb.w};
                const uint32_t lav[4] = {la.x, la.y, la.z, la.w}, lbv[4] = {lb.x, lb.y, lb.z, lb.w};
                if constexpr (WT == GW_Q4_K || WT == GW_Q5_K) {
                    const int p = c >> 1, h = c & 1;
                    const float4 dd = *(const float4 *)(dss + 8 * gc + 2 * p); /* dx, sum of 2p and 2p + 1 */
#pragma unroll
                    for (int r = 0; r < RPW; r++) {
                        const uint32_t *a = raw[u][r].a;
                        int a0 = 0, b0 = 0, a1 = 0, b1 = 0;
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            uint32_t lo = a[k] & 0x0f0f0f0fu, hi = (a[k] >> 4) & 0x0f0f0f0fu;
                            if constexpr (WT == GW_Q5_K) { /* the fifth bit: 16 more */
                                lo |= ((a[8 + k] >> (2 * p)) & 0x01010101u) << 4;
                                hi |= ((a[8 + k] >> (2 * p + 1)) & 0x01010101u) << 4;
                            }
                            a0 = gk8_dot4(lo, xav[k], a0);
                            b0 = gk8_dot4(lo, lav[k], b0);
                            a1 = gk8_dot4(hi, xbv[k], a1);
                            b1 = gk8_dot4(hi, lbv[k], b1);
                        }
                        /* sub-blocks j = 2p, 2p + 1 (core/dtype.h's scale/min unpacking), as
                         * byte pairs: p < 2 reads scales[j] and [j + 4]; p >= 2 the
                         * nibbles of scales[j + 4] and the top bits of [j - 4] and [j] */
                        const int sh = 16 * (p & 1);
                        const uint32_t y2 = a[5] >> sh, z2 = a[6] >> sh, w2 = a[7] >> sh;
                        const uint32_t sc2 = p < 2 ? y2 & 0x3f3fu : (w2 & 0x0f0fu) | ((y2 >> 2) & 0x3030u);
                        const uint32_t m2 = p < 2 ? z2 & 0x3f3fu : ((w2 >> 4) & 0x0f0fu) | ((z2 >> 2) & 0x3030u);
                        const float d = nstf_h2f(a[4]), dmin = nstf_h2f(a[4] >> 16);
                        const float S0 = (float)(a0 * 256 + b0), S1 = (float)(a1 * 256 + b1);
                        const float t = fmaf((float)(sc2 & 0xffu) * dd.x, S0, (float)(sc2 >> 8) * dd.z * S1);
                        /* the min term once per sub-block (the sums cover all 32): lane h = 0 */
                        const float mn = h ? 0.0f : fmaf((float)(m2 & 0xffu), dd.y, (float)(m2 >> 8) * dd.w);
                        acc[r] = fmaf(d, t, fmaf(-dmin, mn, acc[r]));
                    }
                } else if constexpr (T::Q6) {
                    const int n = c >> 2, g = c & 3, sh = 2 * (g >> 1);
                    const int bl = 8 * gc + 4 * n + (g >> 1); /* the 32 of the low run; the high one + 2 */
                    const float dx0 = dss[bl].x, dx1 = dss[bl + 2].x;
                    /* The codes q - 32 are taken as the bytes q (0..63) and the
                     * offset as 32 x the run's sum of x (as its fixed-point
                     * integers): sum (q - 32) x = sum q x - 32 sum x, the same
                     * int32, so the same result to the bit, with the sums of x
                     * made once for every row of the wave. */
                    int xh0 = 0, xl0 = 0, xh1 = 0, xl1 = 0;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        xh0 = gk8_dot4(0x01010101u, xav[k], xh0);
                        xl0 = gk8_dot4(0x01010101u, lav[k], xl0);
                        xh1 = gk8_dot4(0x01010101u, xbv[k], xh1);
                        xl1 = gk8_dot4(0x01010101u, lbv[k], xl1);
                    }
                    const int off0 = 32 * (xh0 * 256 + xl0), off1 = 32 * (xh1 * 256 + xl1);
#pragma unroll
                    for (int r = 0; r < RPW; r++) {
                        const uint32_t *a = raw[u][r].a;
                        /* the file's runs are 2-byte aligned; split rows' 16-byte aligned (a[4], a[9]: 0) */
                        const uint32_t mis =
                            WT == GW_Q6_K ? (uint32_t)((uintptr_t)(wr[r] + (size_t)(gbase + gc) * NSTF_Q6_K_BYTES) & 2) : 0u;
                        int a0 = 0, b0 = 0, a1 = 0, b1 = 0;
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            const uint32_t L = nstf_run16_word(a, k, mis), H = nstf_run16_word(a + 5, k, mis);
                            const uint32_t lo = (L & 0x0f0f0f0fu) | (((H >> sh) & 0x03030303u) << 4); /* q, 0..63 */
                            const uint32_t hi = ((L >> 4) & 0x0f0f0f0fu) | (((H >> (sh + 4)) & 0x03030303u) << 4);
                            a0 = gk8_dot4(lo, xav[k], a0);
                            b0 = gk8_dot4(lo, lav[k], b0);
                            a1 = gk8_dot4(hi, xbv[k], a1);
                            b1 = gk8_dot4(hi, lbv[k], b1);
                        }
                        const float d = nstf_h2f(a[10] >> 16);
                        const float t = fmaf((float)(int8_t)nstf_byte_of(a[10], 0) * dx0, (float)(a0 * 256 + b0 - off0),
                                             (float)(int8_t)nstf_byte_of(a[10], 1) * dx1 * (float)(a1 * 256 + b1 - off1));
                        acc[r] = fmaf(d, t, acc[r]);
                    }
                } else if constexpr (WT == GW_IQ4_XS) { /* d (ls - 32) kvalue; one 32 of x, one dx */
                    const float dx = dss[8 * gc + c].x;
#pragma unroll
                    for (int r = 0; r < RPW; r++) {
                        const uint32_t *a = raw[u][r].a;
                        int ah = 0, al = 0;
#pragma unroll
                        for (int k = 0; k < 4; k++) { /* the code book's entries plus 128, back to int8 */
                            const uint32_t lo = nstf_iq4_lookup4(a[k] & 0x0f0f0f0fu) ^ 0x80808080u;
                            const uint32_t hi = nstf_iq4_lookup4((a[k] >> 4) & 0x0f0f0f0fu) ^ 0x80808080u;
                            ah = gk8_dot4(lo, xav[k], ah);
                            al = gk8_dot4(lo, lav[k], al);
                            ah = gk8_dot4(hi, xbv[k], ah);
                            al = gk8_dot4(hi, lbv[k], al);
                        }
                        /* sub-block c's 6-bit scale: 4 bits of scales_l, 2 of scales_h */
                        const int ls = (int)(((a[5] >> (4 * c)) & 0xfu) | (((a[4] >> (16 + 2 * c)) & 3u) << 4));
                        acc[r] = fmaf(nstf_h2f(a[4]) * (float)(ls - 32), dx * (float)(ah * 256 + al), acc[r]);
                    }
                } else if constexpr (WT == GW_Q8_0 || WT == GW_Q8_0S) { /* d q; one 32 of x, one dx */
                    const float dx = dss[8 * gc + c].x;
#pragma unroll
                    for (int r = 0; r < RPW; r++) {
                        const uint32_t *a = raw[u][r].a;
                        constexpr int DW = WT == GW_Q8_0 ? 10 : 8; /* the scale's word */
                        const uint32_t mis = WT == GW_Q8_0 ? (a[DW] >> 16) & 1u : 0u;
                        int ah = 0, al = 0;
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            uint32_t lo, hi;
                            if constexpr (WT == GW_Q8_0) lo = nstf_run16_word(a, k, mis), hi = nstf_run16_word(a + 5, k, mis);
                            else lo = a[k], hi = a[4 + k];
                            ah = gk8_dot4(lo, xav[k], ah);
                            al = gk8_dot4(lo, lav[k], al);
                            ah = gk8_dot4(hi, xbv[k], ah);
                            al = gk8_dot4(hi, lbv[k], al);
                        }
                        acc[r] = fmaf(nstf_h2f(a[DW]), dx * (float)(ah * 256 + al), acc[r]);
                    }
                } else { /* Q4_0 (either layout): d (q - 8); Q5_0: d (q - 16); Q4_1, Q5_1: d q + m;
                            IQ4_NL (either layout): d kvalue(q); one 32 of x, one dx */
                    const float2 dd = dss[8 * gc + c];
#pragma unroll
                    for (int r = 0; r < RPW; r++) {
                        const uint32_t *a = raw[u][r].a;
                        const uint32_t mis = T::A2 ? (a[5] >> 16) & 1u : 0u;
                        int ah = 0, al = 0;
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            const uint32_t wq = T::A2 ? nstf_run16_word(a, k, mis) : a[k];
                            uint32_t lo = wq & 0x0f0f0f0fu, hi = (wq >> 4) & 0x0f0f0f0fu;
                            if constexpr (WT == GW_Q5_0 || WT == GW_Q5_1) { /* qh bit j: element j's fifth bit */
                                const uint32_t qh = a[WT == GW_Q5_0 ? 6 : 5];
                                lo |= nstf_spread4_b4((qh >> (4 * k)) & 0xfu);
                                hi |= nstf_spread4_b4((qh >> (16 + 4 * k)) & 0xfu);
                            }
                            if constexpr (WT == GW_IQ4_NL || WT == GW_IQ4_NLS) { /* the code book's entries plus 128, back to int8 */
                                lo = nstf_iq4_lookup4(lo) ^ 0x80808080u;
                                hi = nstf_iq4_lookup4(hi) ^ 0x80808080u;
                            }
                            ah = gk8_dot4(lo, xav[k], ah);
                            al = gk8_dot4(lo, lav[k], al);
                            ah = gk8_dot4(hi, xbv[k], ah);
                            al = gk8_dot4(hi, lbv[k], al);
                        }
                        const float S = dd.x * (float)(ah * 256 + al);
                        if constexpr (WT == GW_Q4_0 || WT == GW_Q4_0S || WT == GW_Q5_0)
                            acc[r] = fmaf(nstf_h2f(a[5]), fmaf(WT == GW_Q5_0 ? -16.0f : -8.0f, dd.y, S), acc[r]);
                        else if constexpr (WT == GW_IQ4_NL || WT == GW_IQ4_NLS) acc[r] = fmaf(nstf_h2f(a[5]), S, acc[r]);
                        else acc[r] = fmaf(nstf_h2f(a[4]), S, fmaf(nstf_h2f(a[4] >> 16), dd.y, acc[r]));
                    }
                }
            }
        }
    }
    float accv[RPW][1];
#pragma unroll
    for (int r = 0; r < RPW; r++) accv[r][0] = acc[r];
    gemv_finish<FZ, 1, Y_BF16, ROWS>(accv, rowv, y, n_out, f, fz_sh, lane);
}

/* ---- instances ------------------------------------------------------------ */

/* Instances of R rows per block: the super-block types have none of
 * GEMVQ_ROWS_SMALL rows (nstf_gemvk8_rows never asks for them; the picks
 * give them 16-row blocks for it, as for any other count). */
template <int R> struct gemvk8_k {
    template <bool YB> static gemv_fn pick(int wt) {
        if constexpr (R != GEMVQ_ROWS_SMALL) {
            switch (wt) {
            case GW_Q4_K: return gemvk8_kernel<GW_Q4_K, YB, R, 0>;
            case GW_Q5_K: return gemvk8_kernel<GW_Q5_K, YB, R, 0>;
            case GW_Q6_K: return gemvk8_kernel<GW_Q6_K, YB, R, 0>;
            case GW_Q6_KS: return gemvk8_kernel<GW_Q6_KS, YB, R, 0>;
            case GW_IQ4_XS: return gemvk8_kernel<GW_IQ4_XS, YB, R, 0>;
            }
        }
        switch (wt) {
        case GW_Q8_0: return gemvk8_kernel<GW_Q8_0, YB, R, 0>;
        case GW_Q4_0: return gemvk8_kernel<GW_Q4_0, YB, R, 0>;
        case GW_Q4_0S: return gemvk8_kernel<GW_Q4_0S, YB, R, 0>;
        case GW_IQ4_NLS: return gemvk8_kernel<GW_IQ4_NLS, YB, R, 0>;
        case GW_Q8_0S: return gemvk8_kernel<GW_Q8_0S, YB, R, 0>;
        case GW_Q4_1: return gemvk8_kernel<GW_Q4_1, YB, R, 0>;
        case GW_Q5_0: return gemvk8_kernel<GW_Q5_0, YB, R, 0>;
        case GW_Q5_1: return gemvk8_kernel<GW_Q5_1, YB, R, 0>;
        case GW_IQ4_NL: return gemvk8_kernel<GW_IQ4_NL, YB, R, 0>;
        }
        return nullptr;
    }
};
gemv_fn nstf_gemvk8_pick(int wt, int rows, bool y_bf16) {
    if (rows == GEMVQ_ROWS_BIG)
        return y_bf16 ? gemvk8_k<GEMVQ_ROWS_BIG>::pick<true>(wt) : gemvk8_k<GEMVQ_ROWS_BIG>::pick<false>(wt);
    if (rows == GEMVQ_ROWS_SMALL && !GW_SUPER(wt)) /* the 32-element types only; else 16 rows */
        return y_bf16 ? gemvk8_k<GEMVQ_ROWS_SMALL>::pick<true>(wt) : gemvk8_k<GEMVQ_ROWS_SMALL>::pick<false>(wt);
    return y_bf16 ? gemvk8_k<GEMVQ_ROWS>::pick<true>(wt) : gemvk8_k<GEMVQ_ROWS>::pick<false>(wt);
}

template <int R> struct gemvk8_fused {
    int wt;
    template <int FZ, bool YB> gemv_fn get() const {
        if constexpr (R != GEMVQ_ROWS_SMALL) {
            switch (wt) {
            case GW_Q4_K: return gemvk8_kernel<GW_Q4_K, YB, R, FZ>;
            case GW_Q5_K: return gemvk8_kernel<GW_Q5_K, YB, R, FZ>;
            case GW_Q6_K: return gemvk8_kernel<GW_Q6_K, YB, R, FZ>;
            case GW_Q6_KS: return gemvk8_kernel<GW_Q6_KS, YB, R, FZ>;
            case GW_IQ4_XS: return gemvk8_kernel<GW_IQ4_XS, YB, R, FZ>;
            }
        }
        switch (wt) {
        case GW_Q8_0: return gemvk8_kernel<GW_Q8_0, YB, R, FZ>;
        case GW_Q4_0: return gemvk8_kernel<GW_Q4_0, YB, R, FZ>;
        case GW_Q4_0S: return gemvk8_kernel<GW_Q4_0S, YB, R, FZ>;
        case GW_IQ4_NLS: return gemvk8_kernel<GW_IQ4_NLS, YB, R, FZ>;
        case GW_Q8_0S: return gemvk8_kernel<GW_Q8_0S, YB, R, FZ>;
        case GW_Q4_1: return gemvk8_kernel<GW_Q4_1, YB, R, FZ>;
        case GW_Q5_0: return gemvk8_kernel<GW_Q5_0, YB, R, FZ>;
        case GW_Q5_1: return gemvk8_kernel<GW_Q5_1, YB, R, FZ>;
        case GW_IQ4_NL: return gemvk8_kernel<GW_IQ4_NL, YB, R, FZ>;
        }
        return nullptr;
    }
};
int nstf_gemvk8_fz_bytes(void) { return (int)sizeof(gemv_fz); }
gemv_fn nstf_gemvk8_fused_pick(int wt, int fz, int rows) {
    if (rows == GEMVQ_ROWS_BIG) return gemv_fz_dispatch(fz, gemvk8_fused<GEMVQ_ROWS_BIG>{wt});
    if (rows == GEMVQ_ROWS_SMALL && !GW_SUPER(wt)) return gemv_fz_dispatch(fz, gemvk8_fused<GEMVQ_ROWS_SMALL>{wt});
    return gemv_fz_dispatch(fz, gemvk8_fused<GEMVQ_ROWS>{wt});
}
