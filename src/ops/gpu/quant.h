/* quant.h — device views of every stored weight type (core/dtype.h has the
 * byte layouts): block sizes and the alignment a block keeps inside a row,
 * the byte tricks the GEMVs share (IQ4 code-book lookup with byte permutes,
 * 4 bits spread to 4 bytes, 2-byte aligned 16-byte reads), and dq8<T>: the
 * 8 consecutive values of a row at element i0 (i0 % 8 == 0) as floats,
 * bit for bit what nstf_dequantize_row computes (every product of a scale
 * and a code is exact in fp32: an fp16 scale has 11 significant bits, the
 * sub-block scale at most 7 and the code at most 7, so ggml's order of
 * operations rounds once, at the final add, in either order).
 * Used by get_rows.cu (the embedding gather and the prefill's dequantization
 * into bf16) and, for the shared pieces, by gemvq.cu and gemvk.cu; the
 * GPU's split row layout of Q4_0, IQ4_NL and Q8_0 (nstf_gpu_split_codes). */
#ifndef NSTF_GPU_QUANT_H
#define NSTF_GPU_QUANT_H

#include "gpu.h"

#define NSTF_Q5_0_BYTES 22
#define NSTF_Q5_1_BYTES 24
#define NSTF_IQ4_NL_BYTES 18
#define NSTF_Q2_K_BYTES 84
#define NSTF_Q3_K_BYTES 110
#define NSTF_Q4_K_BYTES 144
#define NSTF_Q5_K_BYTES 176
#define NSTF_Q6_K_BYTES 210
#define NSTF_IQ4_XS_BYTES 136
#define NSTF_GPU_QK_K 256

/* Bytes per block (1 element for the float types). */
__host__ __device__ constexpr int nstf_q_block_bytes(int t) {
    return t == NSTF_TYPE_F32 ? 4 : t == NSTF_TYPE_F16 || t == NSTF_TYPE_BF16 ? 2
           : t == NSTF_TYPE_Q8_0 ? NSTF_Q8_0_BYTES : t == NSTF_TYPE_Q4_0 ? NSTF_Q4_0_BYTES
           : t == NSTF_TYPE_Q4_1 ? NSTF_Q4_1_BYTES : t == NSTF_TYPE_Q5_0 ? NSTF_Q5_0_BYTES
           : t == NSTF_TYPE_Q5_1 ? NSTF_Q5_1_BYTES : t == NSTF_TYPE_IQ4_NL ? NSTF_IQ4_NL_BYTES
           : t == NSTF_TYPE_Q2_K ? NSTF_Q2_K_BYTES : t == NSTF_TYPE_Q3_K ? NSTF_Q3_K_BYTES
           : t == NSTF_TYPE_Q4_K ? NSTF_Q4_K_BYTES : t == NSTF_TYPE_Q5_K ? NSTF_Q5_K_BYTES
           : t == NSTF_TYPE_Q6_K ? NSTF_Q6_K_BYTES : t == NSTF_TYPE_IQ4_XS ? NSTF_IQ4_XS_BYTES : 0;
}
/* Elements per block. */
__host__ __device__ constexpr int nstf_q_block_elems(int t) {
    return t == NSTF_TYPE_F32 || t == NSTF_TYPE_F16 || t == NSTF_TYPE_BF16 ? 1
           : t == NSTF_TYPE_Q2_K || t == NSTF_TYPE_Q3_K || t == NSTF_TYPE_Q4_K || t == NSTF_TYPE_Q5_K ||
                   t == NSTF_TYPE_Q6_K || t == NSTF_TYPE_IQ4_XS
               ? NSTF_GPU_QK_K
               : NSTF_GPU_QK;
}
/* The alignment every block of a row keeps when the row's first byte is so
 * aligned: the largest power of two (at most 16) dividing the block size.
 * The kernels read blocks with loads of that width; a table or a weight
 * matrix whose address is not so aligned is refused by the launchers. */
__host__ __device__ constexpr int nstf_q_align(int t) {
    return nstf_q_block_bytes(t) % 16 == 0 ? 16 : nstf_q_block_bytes(t) % 8 == 0 ? 8
           : nstf_q_block_bytes(t) % 4 == 0 ? 4 : 2;
}

/* ---- the GPU's split rows ------------------------------------------------ *
 * A Q4_0, IQ4_NL or Q8_0 matrix (a 2-byte fp16 scale, then 16 or 32 code
 * bytes per block of 32) whose rows hold a multiple of 256 elements and at
 * most NSTF_GPU_SPLIT_MAX_BYTES is kept on the GPU with each row's bytes
 * rearranged ("split"): its nb = n / 32 scales first, then its nb runs of
 * code bytes. The row keeps its size (a multiple of 16 bytes), and every
 * run of codes is 16-byte aligned when the row is: 16-byte loads of codes
 * instead of realigned words (bench/kernels/gemv/gemv_q40_v2.cu measured
 * 1.2-1.4x on the 8B shapes' Q4_0 GEMVs). nstf_gpu_weights_relayout
 * rewrites an uploaded matrix so; every kernel that reads these types
 * (gemvk_i8, gemvq, get_rows) takes the layout from the row length by this
 * rule. Other rows keep the file's layout. The byte bound keeps a row in
 * the shared memory of the relayout kernel (Q4_0 / IQ4_NL: 65,536
 * elements; Q8_0: 34,560). */
#define NSTF_GPU_SPLIT_MAX_BYTES 36864
/* Code bytes per block of a row of n elements of type t in the split
 * layout (16 or 32), or 0: the row keeps the file's layout. */
__host__ __device__ constexpr int nstf_gpu_split_codes(int t, int64_t n) {
    return (t == NSTF_TYPE_Q4_0 || t == NSTF_TYPE_IQ4_NL || t == NSTF_TYPE_Q8_0) && n > 0 && n % 256 == 0 &&
                   n / 32 * nstf_q_block_bytes(t) <= NSTF_GPU_SPLIT_MAX_BYTES
               ? nstf_q_block_bytes(t) - 2
               : 0;
}
/* Q6_K (210-byte super-blocks: ql[128], qh[64], scales[16], d) the same
 * way, for rows of a multiple of 2048 elements (so that every row starts
 * 16-byte aligned) and at most NSTF_GPU_SPLIT_MAX_BYTES: the row's nb
 * super-blocks' 192 code bytes (ql then qh, as in the block) first, then
 * their nb 16-byte scale arrays, then their nb fp16 d. Every ql / qh run
 * of 16 bytes is then 16-byte aligned, where the file's are 2-byte
 * aligned and read as realigned words (the Q4_K_M files' Q6_K logits
 * GEMV read at about 57% of the copy rate so, docs/PERFORMANCE.md). */
__host__ __device__ constexpr bool nstf_gpu_split_q6k(int t, int64_t n) {
    return t == NSTF_TYPE_Q6_K && n > 0 && n % 2048 == 0 && n / 256 * NSTF_Q6_K_BYTES <= NSTF_GPU_SPLIT_MAX_BYTES;
}
/* Whether rows of n elements of type t are split on the GPU (either rule). */
__host__ __device__ constexpr bool nstf_gpu_split_rows(int t, int64_t n) {
    return nstf_gpu_split_codes(t, n) != 0 || nstf_gpu_split_q6k(t, n);
}
/* The alignment a matrix of type t with rows of n elements must have on
 * the GPU: 16 bytes for split rows, else nstf_q_align(t). */
__host__ __device__ constexpr int nstf_gpu_w_align(int t, int64_t n) {
    return nstf_gpu_split_rows(t, n) ? 16 : nstf_q_align(t);
}

/* ---- byte tricks ------------------------------------------------------------ */

static __device__ __forceinline__ uint32_t nstf_ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }
static __device__ __forceinline__ uint32_t nstf_ld_u32(const uint8_t *p) { return *(const uint32_t *)p; }

/* 16 bytes at p, p 2-byte aligned: the four words at the 4-aligned address
 * at or below p and the last two bytes, realigned by nstf_realign16. */
struct nstf_run16 {
    uint32_t w[5];
};
static __device__ __forceinline__ nstf_run16 nstf_ld_run16_a2(const uint8_t *p) {
    nstf_run16 r;
    const uint8_t *a = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
#pragma unroll
    for (int k = 0; k < 4; k++) r.w[k] = nstf_ld_u32(a + 4 * k);
    r.w[4] = nstf_ld_u16(p + 14); /* needed when a = p - 2; never past the run */
    return r;
}
/* The word at byte 2 of the pair (hi:lo) if mis, else lo: how a 2-byte
 * aligned run is realigned from the words at the 4-aligned address below. */
static __device__ __forceinline__ uint32_t nstf_realign2(uint32_t lo, uint32_t hi, uint32_t mis) {
#if defined(__HIP_PLATFORM_AMD__)
    /* HIP's __byte_perm with a selector known only at run time goes
     * through a byte array in scratch; the funnel shift is one v_alignbit */
    return __builtin_amdgcn_alignbit(hi, lo, mis ? 16u : 0u);
#else
    return __byte_perm(lo, hi, mis ? 0x5432u : 0x3210u);
#endif
}
/* Word k (bytes 4k..4k+3) of a run whose five loaded words are w[0..4];
 * mis: the run's address % 4 == 2. */
static __device__ __forceinline__ uint32_t nstf_run16_word(const uint32_t *w, int k, uint32_t mis) {
    return nstf_realign2(w[k], w[k + 1], mis);
}

/* Bits 0..3 of x into bit 4 of bytes 0..3. */
static __device__ __forceinline__ uint32_t nstf_spread4_b4(uint32_t x) {
    return ((x * 0x00204081u) & 0x01010101u) << 4;
}

/* The IQ4 code book (nstf_iq4nl_values) plus 128, as bytes of 4 words. */
#define NSTF_IQ4_T0 0x3f2d1801u
#define NSTF_IQ4_T1 0x766a5d4fu
#define NSTF_IQ4_T2 0xa6998d81u
#define NSTF_IQ4_T3 0xf1d9c5b5u

/* Code-book entries of four 4-bit codes (one per byte of n, each 0..15),
 * plus 128, one per byte: two 8-entry byte permutes, then a third picks
 * per byte by the code's bit 3. */
static __device__ __forceinline__ uint32_t nstf_iq4_lookup4(uint32_t n) {
    const uint32_t v = n | (n >> 4);
    const uint32_t sel = __byte_perm(v, 0, 0x0020u); /* nibble k = code k */
    const uint32_t lo = __byte_perm(NSTF_IQ4_T0, NSTF_IQ4_T1, sel & 0x7777u);
    const uint32_t hi = __byte_perm(NSTF_IQ4_T2, NSTF_IQ4_T3, sel & 0x7777u);
    return __byte_perm(lo, hi, 0x3210u | ((sel & 0x8888u) >> 1));
}

/* Byte e of w (an unsigned code u) as the float 2^23 + u: subtracting
 * 2^23 + bias then gives u - bias exactly, with no integer conversion. */
static __device__ __forceinline__ float nstf_byte_2p23(uint32_t w, int e) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (uint32_t)e));
}
/* Byte e of w (0x80 | q, q < 128) as the float 1 + q / 128. */
static __device__ __forceinline__ float nstf_byte_1p(uint32_t w, int e) {
    return __uint_as_float(__byte_perm(w, 0x3F000000u, 0x7044u | ((uint32_t)e << 8)));
}

/* Byte i (0..3) of w. */
static __device__ __forceinline__ uint32_t nstf_byte_of(uint32_t w, int i) { return (w >> (8 * i)) & 0xffu; }

static __device__ __forceinline__ float nstf_h2f(uint32_t bits) {
    return nstf_half_bits_to_float((unsigned short)(bits & 0xffffu));
}

/* ---- dq8: 8 values at element i0 of a row ------------------------------------ */

/* Eight bytes at p (p % 2 == 0) as two words. */
static __device__ __forceinline__ uint2 nstf_ld8_a2(const uint8_t *p) {
    return make_uint2(nstf_ld_u16(p) | (nstf_ld_u16(p + 2) << 16), nstf_ld_u16(p + 4) | (nstf_ld_u16(p + 6) << 16));
}

/* The 8 values of elements i0 .. i0 + 7 of a row of type T (i0 % 8 == 0;
 * the row aligned as nstf_gpu_w_align says). nbs: the row's block count
 * when it is in the split layout (nstf_gpu_split_rows), else 0. */
template <int T>
static __device__ __forceinline__ void dq8(const uint8_t *__restrict__ row, int64_t i0, float (&v)[8], int64_t nbs = 0) {
    if constexpr (T == NSTF_TYPE_Q4_0 || T == NSTF_TYPE_IQ4_NL || T == NSTF_TYPE_Q8_0) {
        if (nbs) { /* scales, then runs of codes: 8 aligned bytes */
            constexpr int CB = nstf_q_block_bytes(T) - 2;
            const int64_t b = i0 / 32;
            const int j0 = (int)(i0 % 32), hi = j0 >= 16;
            const uint2 q = *(const uint2 *)(row + 2 * nbs + CB * b + (CB == 32 ? j0 : j0 & 15));
            const float d = nstf_h2f(nstf_ld_u16(row + 2 * b));
            if constexpr (T == NSTF_TYPE_Q8_0) {
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = d * (float)(int8_t)((k < 4 ? q.x : q.y) >> (8 * (k & 3)));
            } else if constexpr (T == NSTF_TYPE_IQ4_NL) {
                const uint32_t c0 = nstf_iq4_lookup4((q.x >> (4 * hi)) & 0x0f0f0f0fu);
                const uint32_t c1 = nstf_iq4_lookup4((q.y >> (4 * hi)) & 0x0f0f0f0fu);
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = d * (nstf_byte_2p23(k < 4 ? c0 : c1, k & 3) - 8388736.0f);
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++)
                    v[k] = d * (float)((int)(((k < 4 ? q.x : q.y) >> (8 * (k & 3) + 4 * hi)) & 0xf) - 8);
            }
            return;
        }
    }
    if constexpr (T == NSTF_TYPE_F32) {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = ((const float *)row)[i0 + k];
    } else if constexpr (T == NSTF_TYPE_F16 || T == NSTF_TYPE_BF16) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint32_t h = ((const uint16_t *)row)[i0 + k];
            v[k] = T == NSTF_TYPE_F16 ? nstf_h2f(h) : __uint_as_float(h << 16);
        }
    } else if constexpr (nstf_q_block_elems(T) == NSTF_GPU_QK) {
        const uint8_t *b = row + (i0 / 32) * nstf_q_block_bytes(T);
        const int j0 = (int)(i0 % 32), hi = j0 >= 16, l0 = j0 & 15;
        if constexpr (T == NSTF_TYPE_Q8_0) {
            const float d = nstf_h2f(nstf_ld_u16(b));
            const uint2 q = nstf_ld8_a2(b + 2 + j0);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = d * (float)(int8_t)((k < 4 ? q.x : q.y) >> (8 * (k & 3)));
            return;
        }
        /* 4-bit codes: qs at `qo`, element j < 16 the low nibble of qs[j], j + 16 the high one */
        const int qo = T == NSTF_TYPE_Q4_1 ? 4 : T == NSTF_TYPE_Q5_0 ? 6 : T == NSTF_TYPE_Q5_1 ? 8 : 2;
        const uint2 q = nstf_ld8_a2(b + qo + l0);
        const float d = nstf_h2f(nstf_ld_u16(b));
        if constexpr (T == NSTF_TYPE_IQ4_NL) {
            const uint32_t c0 = nstf_iq4_lookup4((q.x >> (4 * hi)) & 0x0f0f0f0fu);
            const uint32_t c1 = nstf_iq4_lookup4((q.y >> (4 * hi)) & 0x0f0f0f0fu);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = d * (nstf_byte_2p23(k < 4 ? c0 : c1, k & 3) - 8388736.0f);
            return;
        }
        uint32_t qh = 0;
        float m = 0.0f;
        if constexpr (T == NSTF_TYPE_Q5_0) qh = nstf_ld_u16(b + 2) | (nstf_ld_u16(b + 4) << 16);
        if constexpr (T == NSTF_TYPE_Q5_1) qh = nstf_ld_u16(b + 4) | (nstf_ld_u16(b + 6) << 16);
        if constexpr (T == NSTF_TYPE_Q4_1 || T == NSTF_TYPE_Q5_1) m = nstf_h2f(nstf_ld_u16(b + 2));
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int c = (int)(((k < 4 ? q.x : q.y) >> (8 * (k & 3) + 4 * hi)) & 0xf);
            if constexpr (T == NSTF_TYPE_Q5_0 || T == NSTF_TYPE_Q5_1) c |= (int)((qh >> (j0 + k)) & 1) << 4;
            if constexpr (T == NSTF_TYPE_Q4_0) v[k] = d * (float)(c - 8);
            else if constexpr (T == NSTF_TYPE_Q5_0) v[k] = d * (float)(c - 16);
            else v[k] = d * (float)c + m; /* Q4_1, Q5_1 */
        }
    } else {
        const uint8_t *b = row + (i0 / 256) * nstf_q_block_bytes(T);
        const int w0 = (int)(i0 % 256);
        if constexpr (T == NSTF_TYPE_Q2_K) { /* e = 128n + 32j + l: (qs[32n + l] >> 2j) & 3, scales[e / 16] */
            const int n = w0 / 128, j = (w0 % 128) / 32, l0 = w0 % 32;
            const uint32_t dd = nstf_ld_u32(b + 80);
            const float d = nstf_h2f(dd), dmin = nstf_h2f(dd >> 16);
            const uint32_t s = b[w0 / 16];
            const float dl = d * (float)(s & 0xf), ml = dmin * (float)(s >> 4);
            const uint32_t q0 = nstf_ld_u32(b + 16 + 32 * n + l0), q1 = nstf_ld_u32(b + 20 + 32 * n + l0);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = dl * (float)(((k < 4 ? q0 : q1) >> (8 * (k & 3) + 2 * j)) & 3) - ml;
        } else if constexpr (T == NSTF_TYPE_Q3_K) { /* low bits as Q2_K, bit (4n + j) of hmask[l] clear: -4 */
            const int n = w0 / 128, j = (w0 % 128) / 32, l0 = w0 % 32, i = w0 / 16;
            const float d = nstf_h2f(nstf_ld_u16(b + 108));
            const int lo = (b[96 + i % 8] >> (4 * (i / 8))) & 0xf, hi2 = (b[104 + i % 4] >> (2 * (i / 4))) & 3;
            const float dl = d * (float)((lo | (hi2 << 4)) - 32);
            const uint2 q = nstf_ld8_a2(b + 32 + 32 * n + l0), hm = nstf_ld8_a2(b + l0);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int sh = 8 * (k & 3);
                const int c = (int)(((k < 4 ? q.x : q.y) >> (sh + 2 * j)) & 3) -
                              ((((k < 4 ? hm.x : hm.y) >> (sh + 4 * n + j)) & 1) ? 0 : 4);
                v[k] = dl * (float)c;
            }
        } else if constexpr (T == NSTF_TYPE_Q4_K || T == NSTF_TYPE_Q5_K) {
            /* e = 64j + 32h + l: nibble h of qs[32j + l], sub-block 2j + h;
             * Q5_K: bit 2j + h of qh[l] is bit 4 */
            const int j = w0 / 64, h = (w0 % 64) / 32, l0 = w0 % 32, s = 2 * j + h;
            const uint4 hd = *(const uint4 *)b; /* d, dmin, scales[12] */
            const uint32_t sc4[3] = {hd.y, hd.z, hd.w};
            uint32_t sc, m;
            if (s < 4) {
                sc = (sc4[0] >> (8 * s)) & 63;
                m = (sc4[1] >> (8 * s)) & 63;
            } else {
                const uint32_t q8 = (sc4[2] >> (8 * (s - 4))) & 0xff;
                sc = (q8 & 0xf) | (((sc4[0] >> (8 * (s - 4))) & 0xff) >> 6 << 4);
                m = (q8 >> 4) | (((sc4[1] >> (8 * (s - 4))) & 0xff) >> 6 << 4);
            }
            const float d1 = nstf_h2f(hd.x) * (float)sc, m1 = nstf_h2f(hd.x >> 16) * (float)m;
            const int qo = T == NSTF_TYPE_Q5_K ? 48 : 16;
            const uint2 q = *(const uint2 *)(b + qo + 32 * j + l0);
            uint2 qh = make_uint2(0, 0);
            if constexpr (T == NSTF_TYPE_Q5_K) qh = *(const uint2 *)(b + 16 + l0);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int sh = 8 * (k & 3);
                int c = (int)(((k < 4 ? q.x : q.y) >> (sh + 4 * h)) & 0xf);
                if constexpr (T == NSTF_TYPE_Q5_K) c |= (int)(((k < 4 ? qh.x : qh.y) >> (sh + s)) & 1) << 4;
                v[k] = d1 * (float)c - m1;
            }
        } else if constexpr (T == NSTF_TYPE_Q6_K) {
            /* e = 128n + 32k + l: nibble k >> 1 of ql[64n + l + 32 (k & 1)],
             * bits 2k of qh[32n + l] above it; minus 32; int8 scale of e / 16.
             * Split rows (quant.h): the codes of super-block sb at 192 sb,
             * its scales at 192 nbs + 16 sb, its d at 208 nbs + 2 sb. */
            const int n = w0 / 128, kk = (w0 % 128) / 32, l0 = w0 % 32;
            const int64_t sb = i0 / 256;
            const uint8_t *bq = nbs ? row + 192 * sb : b;
            const uint8_t *bs = nbs ? row + 192 * nbs + 16 * sb : b + 192;
            const float d = nstf_h2f(nstf_ld_u16(nbs ? row + 208 * nbs + 2 * sb : b + 208));
            const float dl = d * (float)(int8_t)bs[w0 / 16];
            const uint2 ql = nbs ? *(const uint2 *)(bq + 64 * n + l0 + 32 * (kk & 1)) : nstf_ld8_a2(b + 64 * n + l0 + 32 * (kk & 1));
            const uint2 qh = nbs ? *(const uint2 *)(bq + 128 + 32 * n + l0) : nstf_ld8_a2(b + 128 + 32 * n + l0);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int sh = 8 * (k & 3);
                const int c = (int)(((k < 4 ? ql.x : ql.y) >> (sh + 4 * (kk >> 1))) & 0xf) |
                              (int)((((k < 4 ? qh.x : qh.y) >> (sh + 2 * kk)) & 3) << 4);
                v[k] = dl * (float)(c - 32);
            }
        } else { /* IQ4_XS: sub-block sb (32 values), IQ4_NL-layout nibbles qs[16sb..] */
            const int sb = w0 / 32, hi = (w0 % 32) / 16, l0 = w0 % 16;
            const uint2 hd = *(const uint2 *)b; /* d, scales_h, scales_l[4] */
            const int ls = (int)(((hd.y >> (8 * (sb / 2) + 4 * (sb % 2))) & 0xf) | (((hd.x >> (16 + 2 * sb)) & 3) << 4));
            const float dl = nstf_h2f(hd.x) * (float)(ls - 32);
            const uint2 q = *(const uint2 *)(b + 8 + 16 * sb + l0);
            const uint32_t c0 = nstf_iq4_lookup4((q.x >> (4 * hi)) & 0x0f0f0f0fu);
            const uint32_t c1 = nstf_iq4_lookup4((q.y >> (4 * hi)) & 0x0f0f0f0fu);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = dl * (nstf_byte_2p23(k < 4 ? c0 : c1, k & 3) - 8388736.0f);
        }
    }
}

#endif
