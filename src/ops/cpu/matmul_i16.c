/* matmul_i16.c — the 16-bit activation matmul of the 32-element block
 * types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and of Q2_K, Q3_K, Q4_K,
 * Q5_K, Q6_K, IQ4_XS:
 * nstf_cpu_matmul_a16's path for them (ops.h; matmul_i16.h).
 *
 * Activations are quantized once per call, per block of 32, to int16:
 * d = amax / 32767, q = nearest-even(x * 32767 / amax) (0 when amax == 0),
 * s = d * sum(q), and the halves' sums sl, sh = d * sum(q) over elements
 * 0..15 and 16..31 (Q2_K's mins go by 16); each x element moves by at most
 * d / 2 = amax / 65534,
 * as fine as the two 8-bit levels (x blocks plus their residual's blocks)
 * that the other types use, at one integer dot product per block instead
 * of two. A weight block is decoded once per tile to 32 signed codes
 * (offsets applied: Q4_0 q - 8, Q5_0 q - 16; IQ4_NL through its table)
 * widened to int16, and meets each token's block in _mm256_madd_epi16:
 *   y += d_w * d_x * sum(code * q)   (+ m_w * s for Q4_1 / Q5_1)
 * |code| <= 128 and |q| <= 32767, so a block's sum is at most
 * 32 * 128 * 32767 < 2^28: exact in int32.
 *
 * The super-block types decode a 256-value super-block per row into 8
 * such blocks of int16 codes, with a scale per block of 32 and row (see
 * ktile_avx2); the mins of Q4_K / Q5_K meet s as Q4_1's do, Q2_K's the
 * halves' sums.
 *
 * Tiles: 8 weight rows (one vector lane each, as matmul.c's 8-bit tiles:
 * rows past rm repeat row rm - 1 and are not stored) x RN_I16 tokens; the
 * 8 rows' int32 sums of a block are folded into one vector by a tree, so a
 * block costs one convert and one FMA per token for all 8 rows. Threads
 * split the row tiles (the tokens when there are too few of them); every
 * output is computed the same way whatever the split. A portable scalar
 * tile computes the same integers (fp32 rounding may differ). */
#include "ops/cpu/matmul_i16.h"

#include <math.h>
#include <string.h>

#include "core/mem.h"
#include "core/threadpool.h"
#include "ops/cpu/matmul_k.h"
#include "ops/cpu/q32_simd.h"

#define QK NSTF_QK
#define RN_I16 8
#define TOK_CHUNK 32
#define ALWAYS_INLINE inline __attribute__((always_inline))

static bool is_k(nstf_type t) {
    return t == NSTF_TYPE_Q2_K || t == NSTF_TYPE_Q3_K || t == NSTF_TYPE_Q4_K || t == NSTF_TYPE_Q5_K || t == NSTF_TYPE_Q6_K ||
           t == NSTF_TYPE_IQ4_XS;
}

bool nstf_i16_type(nstf_type t) {
    return t == NSTF_TYPE_Q4_0 || t == NSTF_TYPE_Q4_1 || t == NSTF_TYPE_Q5_0 || t == NSTF_TYPE_Q5_1 ||
           t == NSTF_TYPE_Q8_0 || t == NSTF_TYPE_IQ4_NL || is_k(t);
}

/* Below 4 tokens a super-block's decode to int16 costs more than it saves
 * (1 token: 1.6x the two 8-bit levels' time; 4: 0.9x; 8: 0.7x, measured
 * at 1536 -> 576 on Zen 3). */
bool nstf_i16_serves(nstf_type t, int64_t n_tok) { return nstf_i16_type(t) && (!is_k(t) || n_tok >= 4); }

static uint64_t align64(uint64_t v) { return (v + 63) & ~(uint64_t)63; }

/* q [n_tok][nb][32] int16, then d, s, sl and sh [n_tok][nb] fp32, each
 * 64-byte aligned from a 64-byte aligned start. */
bool nstf_i16_bytes(int64_t n_tok, int64_t n_in, uint64_t *out) {
    if (n_tok < 0 || n_in < 0 || n_in % QK != 0) return false;
    uint64_t nblk, q, f, tot;
    if (!nstf_mul_ok((uint64_t)n_tok, (uint64_t)(n_in / QK), &nblk) || !nstf_mul_ok(nblk, 2 * QK, &q) ||
        !nstf_mul_ok(nblk, 4, &f))
        return false;
    if (!nstf_add_ok(align64(q), NSTF_I16_FLOATS * align64(f), &tot)) return false;
    return nstf_add_ok(tot, 64, out);
}

typedef struct {
    int16_t *q;
    float *d, *s, *sl, *sh;
    int64_t nb;
} xq16;

static void carve(void *base, int64_t n_tok, int64_t n_in, xq16 *x) {
    const uint64_t nblk = (uint64_t)n_tok * (uint64_t)(n_in / QK);
    char *p = (char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
    x->q = (int16_t *)p;
    x->d = (float *)(p + align64(nblk * 2 * QK));
    x->s = (float *)(p + align64(nblk * 2 * QK) + align64(nblk * 4));
    x->sl = (float *)(p + align64(nblk * 2 * QK) + 2 * align64(nblk * 4));
    x->sh = (float *)(p + align64(nblk * 2 * QK) + 3 * align64(nblk * 4));
    x->nb = n_in / QK;
}

/* One token's row; the AVX2 and scalar versions give the same bits. */
void nstf_i16_quantize_row(const float *x, int16_t *q, float *d, float *s, float *sl, float *sh, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        int isum = 0, ilo = 0;
#if NSTF_CPU_HAVE_AVX2
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 v[4], m = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        amax = _mm_cvtss_f32(m4);
        const __m256 vid = _mm256_set1_ps(amax != 0.0f ? 32767.0f / amax : 0.0f);
        __m256i i[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], vid)); /* nearest-even */
        const __m256i vl = _mm256_add_epi32(i[0], i[1]), vh = _mm256_add_epi32(i[2], i[3]);
        /* lane 0: the low half's sum, lane 1: the high half's */
        __m256i vp = _mm256_hadd_epi32(vl, vh); /* l01 l23 h01 h23 | l45 l67 h45 h67 */
        vp = _mm256_hadd_epi32(vp, vp);          /* l0123 h0123 .. | l4567 h4567 .. */
        const __m128i s2 = _mm_add_epi32(_mm256_castsi256_si128(vp), _mm256_extracti128_si256(vp, 1));
        ilo = _mm_cvtsi128_si32(s2);
        isum = ilo + _mm_extract_epi32(s2, 1);
        /* packs interleave 128-bit lanes; the permute restores element order */
        _mm256_storeu_si256((__m256i *)(q + b * QK), _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xd8));
        _mm256_storeu_si256((__m256i *)(q + b * QK + 16),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), 0xd8));
#else
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float id = amax != 0.0f ? 32767.0f / amax : 0.0f;
        for (int j = 0; j < QK; j++) {
            const int v = (int)nearbyintf(xb[j] * id);
            q[b * QK + j] = (int16_t)v;
            isum += v;
            if (j < QK / 2) ilo += v;
        }
#endif
        d[b] = amax / 32767.0f;
        s[b] = d[b] * (float)isum;
        sl[b] = d[b] * (float)ilo;
        sh[b] = d[b] * (float)(isum - ilo);
    }
}

/* ---- scalar tile (every CPU; the model of the SIMD arithmetic) ----------- */

/* Code j of a block (offsets applied) and whether the type has a min. */
static int code_at(nstf_type t, const uint8_t *bl, int j) {
    const int lo = j < 16, k = j & 15;
    switch (t) {
    case NSTF_TYPE_Q8_0: return (int8_t)bl[2 + j];
    case NSTF_TYPE_Q4_0: return (lo ? bl[2 + k] & 15 : bl[2 + k] >> 4) - 8;
    case NSTF_TYPE_Q4_1: return lo ? bl[4 + k] & 15 : bl[4 + k] >> 4;
    case NSTF_TYPE_IQ4_NL: return nstf_iq4nl_values[lo ? bl[2 + k] & 15 : bl[2 + k] >> 4];
    default: { /* Q5_0, Q5_1 */
        const int q51 = t == NSTF_TYPE_Q5_1;
        uint32_t qh;
        memcpy(&qh, bl + (q51 ? 4 : 2), 4);
        const uint8_t b = bl[(q51 ? 8 : 6) + k];
        const int c = (lo ? b & 15 : b >> 4) | (int)(((qh >> j) & 1) << 4);
        return q51 ? c : c - 16;
    }
    }
}

static void tile_scalar(nstf_type t, const uint8_t *w, uint64_t row_bytes, int rm, const xq16 *x, int64_t t0,
                        int rn, float *y, int64_t ldy) {
    const uint64_t bb = (uint64_t)nstf_type_block_bytes(t);
    const bool has_m = t == NSTF_TYPE_Q4_1 || t == NSTF_TYPE_Q5_1;
    for (int r = 0; r < rm; r++)
        for (int k = 0; k < rn; k++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < x->nb; b++) {
                const uint8_t *bl = w + (uint64_t)r * row_bytes + (uint64_t)b * bb;
                const int64_t xb = (t0 + k) * x->nb + b;
                const int16_t *q = x->q + xb * QK;
                int32_t isum = 0;
                for (int j = 0; j < QK; j++) isum += code_at(t, bl, j) * q[j];
                acc += (float)isum * (nstf_fp16_to_f32(nstf_load_u16(bl)) * x->d[xb]);
                if (has_m) acc += nstf_fp16_to_f32(nstf_load_u16(bl + 2)) * x->s[xb];
            }
            y[k * ldy + r] = acc;
        }
}

/* Super-blocks: W[e] = d * sc[e/16] * q[e] - dmin * m[e/16] (nstf_mmk_decode)
 * against the 8 x blocks of 32 it spans. */
static void ktile_scalar(nstf_type t, const uint8_t *w, uint64_t row_bytes, int rm, const xq16 *x, int64_t t0,
                         int rn, float *y, int64_t ldy) {
    const uint64_t bb = (uint64_t)nstf_type_block_bytes(t);
    nstf_mmk_block blk;
    for (int r = 0; r < rm; r++) {
        float acc[RN_I16] = {0};
        for (int64_t b = 0; b < x->nb / 8; b++) {
            nstf_mmk_decode(t, w + (uint64_t)r * row_bytes + (uint64_t)b * bb, &blk);
            for (int k = 0; k < rn; k++)
                for (int c = 0; c < 8; c++) {
                    const int64_t xb = (t0 + k) * x->nb + 8 * b + c;
                    const int16_t *q = x->q + xb * QK;
                    int32_t lo = 0, hi = 0, slo = 0, shi = 0;
                    for (int j = 0; j < 16; j++) {
                        lo += blk.q[32 * c + j] * blk.sc[2 * c] * q[j];
                        hi += blk.q[32 * c + 16 + j] * blk.sc[2 * c + 1] * q[16 + j];
                        slo += q[j];
                        shi += q[16 + j];
                    }
                    acc[k] += (float)(lo + hi) * (blk.d * x->d[xb]);
                    acc[k] -= (float)(blk.m[2 * c] * slo + blk.m[2 * c + 1] * shi) * (blk.dmin * x->d[xb]);
                }
        }
        for (int k = 0; k < rn; k++) y[k * ldy + r] = acc[k];
    }
}

/* ---- AVX2 tiles ----------------------------------------------------------- */
#if NSTF_CPU_HAVE_AVX2
enum { K_Q4_0, K_Q4_1, K_Q5_0, K_Q5_1, K_Q8_0, K_IQ4_NL, K_Q4_K, K_Q5_K, K_Q6_K, K_IQ4_XS, K_Q3_K, K_Q2_K, N_KINDS };

/* acc[t] lane r -> y[t * ldy + r] for r < rm. */
static ALWAYS_INLINE void store_tile(const int RN, const __m256 *acc, int rm, float *y, int64_t ldy) {
    if (rm == 8) {
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);
    } else {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(rm), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) _mm256_maskstore_ps(y + t * ldy, mask, acc[t]);
    }
}

/* The 32 signed codes of one block. */
static ALWAYS_INLINE __m256i codes32(const int kind, const uint8_t *bl, __m256i iq4) {
    switch (kind) {
    case K_Q8_0: return _mm256_loadu_si256((const __m256i *)(bl + 2));
    case K_Q4_0: return _mm256_sub_epi8(nstf_q32_nibbles(bl + 2), _mm256_set1_epi8(8));
    case K_Q4_1: return nstf_q32_nibbles(bl + 4);
    case K_IQ4_NL: return _mm256_shuffle_epi8(iq4, nstf_q32_nibbles(bl + 2));
    default: { /* Q5_0, Q5_1 */
        const int q51 = kind == K_Q5_1;
        uint32_t qh;
        memcpy(&qh, bl + (q51 ? 4 : 2), 4);
        const __m256i c = _mm256_or_si256(nstf_q32_nibbles(bl + (q51 ? 8 : 6)),
                                          _mm256_and_si256(nstf_q32_bits(qh), _mm256_set1_epi8(0x10)));
        return q51 ? c : _mm256_sub_epi8(c, _mm256_set1_epi8(16));
    }
    }
}

static ALWAYS_INLINE void tile_avx2(const int kind, const int RN, const uint8_t *w, uint64_t row_bytes, int rm,
                                    const xq16 *x, int64_t t0, float *y, int64_t ldy) {
    const int bb = kind == K_Q4_0 || kind == K_IQ4_NL ? 18 : kind == K_Q4_1 ? 20 : kind == K_Q5_0 ? 22
                 : kind == K_Q5_1 ? 24 : 34;
    const bool has_m = kind == K_Q4_1 || kind == K_Q5_1;
    const __m256i iq4 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nstf_iq4nl_values));
    const uint8_t *wr[8];
    for (int r = 0; r < 8; r++) wr[r] = w + (uint64_t)(r < rm ? r : rm - 1) * row_bytes;
    const int64_t nb = x->nb;
    const int16_t *xq = x->q + t0 * nb * QK;
    const float *xd = x->d + t0 * nb, *xs = x->s + t0 * nb;
    __m256 acc[RN_I16];
#pragma GCC unroll 8
    for (int t = 0; t < RN; t++) acc[t] = _mm256_setzero_ps();
    /* decode (RN <= 2) streams the weights: prefetch the next tile's rows
     * at the pace this one consumes its own */
    const uint8_t *pf = w + 8 * row_bytes;
    for (int64_t b = 0; b < nb; b++) {
        const uint64_t off = (uint64_t)b * (uint64_t)bb;
        if (RN <= 2) {
            nstf_q32_prefetch(pf, 8 * bb);
            pf += 8 * bb;
        }
        __m256 mv = _mm256_setzero_ps();
        const __m256 dv = nstf_q32_scales8(wr, off, has_m, &mv);
        __m256i wlo[8], whi[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m256i c = codes32(kind, wr[r] + off, iq4);
            wlo[r] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(c));
            whi[r] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(c, 1));
        }
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) {
            const __m256i xlo = _mm256_load_si256((const __m256i *)(xq + (t * nb + b) * QK));
            const __m256i xhi = _mm256_load_si256((const __m256i *)(xq + (t * nb + b) * QK + 16));
            __m256i p[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                p[r] = _mm256_add_epi32(_mm256_madd_epi16(wlo[r], xlo), _mm256_madd_epi16(whi[r], xhi));
            const __m256i isum = nstf_q32_reduce8_i32(p);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dv, _mm256_broadcast_ss(xd + t * nb + b)),
                                     acc[t]);
            if (has_m) acc[t] = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(xs + t * nb + b), acc[t]);
        }
    }
    store_tile(RN, acc, rm, y, ldy);
}

/* Super-block tiles (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS): per super-block
 * the 8 rows are decoded to int16 into wq[chunk][row][32], with per chunk of
 * 32 a scale vector over the rows (dv: d * sc for Q4_K / Q5_K, d (ls - 32)
 * for IQ4_XS whose codes are the code book's values, d for Q2_K, Q3_K and
 * Q6_K whose 16-value scales are multiplied into their codes) and the mins'
 * (mv = -dmin * m; Q2_K's two per chunk, mv for elements 0..15 against sl,
 * mh for 16..31 against sh). Q2_K's q * sc <= 3 * 15 = 45; Q3_K's
 * |(q - 4) * sc| <= 4 * 32 = 128; Q6_K's
 * |(q - 32) * sc| <= 32 * 128 = 4096, so 16 products
 * with |x| <= 32767 stay below 2^31: the tree sums in int32 up to 4 lanes
 * of 4 products and finishes in fp32. */

/* The sums of RN tokens from t0 over super-block b's 8 decoded chunks
 * (wq, dvs, mvs, mhs), added to accm (in registers over the chunks). */
static ALWAYS_INLINE void ktile_tokens(const int kt, const int RN, const xq16 *x, int64_t t0, int64_t b,
                                       const int16_t (*wq)[8][32], const float (*dvs)[8], const float (*mvs)[8],
                                       const float (*mhs)[8], __m256 *accm) {
    const int64_t nb = x->nb;
    __m256 acc[RN_I16];
#pragma GCC unroll 8
    for (int t = 0; t < RN; t++) acc[t] = accm[t];
    for (int c = 0; c < 8; c++) {
        const __m256 dv = _mm256_load_ps(dvs[c]), mv = _mm256_load_ps(mvs[c]);
        const __m256 mh = kt == NSTF_TYPE_Q2_K ? _mm256_load_ps(mhs[c]) : mv;
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) {
            const int64_t xb = (t0 + t) * nb + 8 * b + c;
            const __m256i xlo = _mm256_load_si256((const __m256i *)(x->q + xb * QK));
            const __m256i xhi = _mm256_load_si256((const __m256i *)(x->q + xb * QK + 16));
            __m256i p[8], a[4];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                p[r] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_load_si256((const __m256i *)wq[c][r]), xlo),
                                        _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(wq[c][r] + 16)), xhi));
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                a[r] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * r], p[2 * r + 1]),
                                        _mm256_unpackhi_epi32(p[2 * r], p[2 * r + 1]));
            const __m256 b0 = _mm256_cvtepi32_ps(
                _mm256_add_epi32(_mm256_unpacklo_epi64(a[0], a[1]), _mm256_unpackhi_epi64(a[0], a[1])));
            const __m256 b1 = _mm256_cvtepi32_ps(
                _mm256_add_epi32(_mm256_unpacklo_epi64(a[2], a[3]), _mm256_unpackhi_epi64(a[2], a[3])));
            const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
            acc[t] = _mm256_fmadd_ps(sum, _mm256_mul_ps(dv, _mm256_broadcast_ss(x->d + xb)), acc[t]);
            if (kt == NSTF_TYPE_Q4_K || kt == NSTF_TYPE_Q5_K)
                acc[t] = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(x->s + xb), acc[t]);
            if (kt == NSTF_TYPE_Q2_K) {
                acc[t] = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(x->sl + xb), acc[t]);
                acc[t] = _mm256_fmadd_ps(mh, _mm256_broadcast_ss(x->sh + xb), acc[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < RN; t++) accm[t] = acc[t];
}

/* n_full groups of 8 tokens from t0, then a group of RN: each super-block
 * of the 8 rows is decoded once for all of them (up to TOK_CHUNK tokens;
 * it was once per 8), their sums kept in accs between super-blocks. */
static ALWAYS_INLINE void ktile_avx2(const int kt, const int RN, const uint8_t *w, uint64_t row_bytes, int rm,
                                     const xq16 *x, int64_t t0, int n_full, float *y, int64_t ldy) {
    const uint64_t bb = (uint64_t)nstf_type_block_bytes((nstf_type)kt);
    const uint8_t *wr[8];
    for (int r = 0; r < 8; r++) wr[r] = w + (uint64_t)(r < rm ? r : rm - 1) * row_bytes;
    const int64_t nb = x->nb;
    __m256 accs[TOK_CHUNK / RN_I16][RN_I16];
    for (int g = 0; g <= n_full; g++)
        for (int t = 0; t < RN_I16; t++) accs[g][t] = _mm256_setzero_ps();
    _Alignas(32) int16_t wq[8][8][32];
    _Alignas(32) float dvs[8][8], mvs[8][8], mhs[8][8];
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb / 8; b++) {
        for (int r = 0; r < 8; r++) {
            const uint8_t *blk = wr[r] + (uint64_t)b * (uint64_t)bb;
            __m256i c8[8];
            if (kt == NSTF_TYPE_Q2_K) { /* chunk c = 4n + j: bits 2j of qs[32n..]; 16-value scales and mins */
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk + 80)), dmin = nstf_fp16_to_f32(nstf_load_u16(blk + 82));
                const __m256i m3 = _mm256_set1_epi8(3);
                for (int n = 0; n < 2; n++) {
                    const __m256i Q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * n));
                    for (int j = 0; j < 4; j++) {
                        const int c = 4 * n + j;
                        const __m256i v = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * j), m3);
                        _mm256_store_si256((__m256i *)wq[c][r], _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)),
                                                                                   _mm256_set1_epi16(blk[2 * c] & 0xF)));
                        _mm256_store_si256((__m256i *)(wq[c][r] + 16),
                                           _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)),
                                                              _mm256_set1_epi16(blk[2 * c + 1] & 0xF)));
                        dvs[c][r] = d;
                        mvs[c][r] = -dmin * (float)(blk[2 * c] >> 4);
                        mhs[c][r] = -dmin * (float)(blk[2 * c + 1] >> 4);
                    }
                }
            } else if (kt == NSTF_TYPE_Q3_K) { /* chunk c = 4n + j: bits 2j of qs[32n..], bit c of hmask, minus 4 */
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk + 108));
                _Alignas(16) int8_t sc[16];
                _mm_store_si128((__m128i *)sc, nstf_q3k_scales16(blk + 96));
                const __m256i hm = _mm256_loadu_si256((const __m256i *)blk), m3 = _mm256_set1_epi8(3),
                              m04 = _mm256_set1_epi8(4);
                for (int n = 0; n < 2; n++) {
                    const __m256i Q = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * n));
                    for (int j = 0; j < 4; j++) {
                        const int c = 4 * n + j;
                        const __m256i h = c <= 2 ? _mm256_slli_epi16(hm, 2 - c) : _mm256_srli_epi16(hm, c - 2);
                        const __m256i v = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(Q, 2 * j), m3),
                                                                          _mm256_and_si256(h, m04)),
                                                          m04);
                        _mm256_store_si256((__m256i *)wq[c][r], _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                                                                                   _mm256_set1_epi16(sc[2 * c])));
                        _mm256_store_si256((__m256i *)(wq[c][r] + 16),
                                           _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
                                                              _mm256_set1_epi16(sc[2 * c + 1])));
                        dvs[c][r] = d;
                        mvs[c][r] = 0.0f;
                    }
                }
            } else if (kt == NSTF_TYPE_IQ4_XS) { /* sub-block c: 16 bytes at 8 + 16 c, as an IQ4_NL block's */
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk));
                const uint16_t sh = nstf_load_u16(blk + 2);
                const __m256i iq4 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nstf_iq4nl_values));
                for (int c = 0; c < 8; c++) {
                    const int ls = ((blk[4 + c / 2] >> (4 * (c % 2))) & 0xF) | (((sh >> (2 * c)) & 3) << 4);
                    const __m256i v = _mm256_shuffle_epi8(iq4, nstf_q32_nibbles(blk + 8 + 16 * c));
                    _mm256_store_si256((__m256i *)wq[c][r], _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
                    _mm256_store_si256((__m256i *)(wq[c][r] + 16), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
                    dvs[c][r] = d * (float)(ls - 32);
                    mvs[c][r] = 0.0f;
                }
            } else if (kt == NSTF_TYPE_Q6_K) {
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk + 208));
                const __m256i m30 = _mm256_set1_epi8(0x30), o32 = _mm256_set1_epi8(32);
                for (int n = 0; n < 2; n++) {
                    const __m256i A = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
                    const __m256i B = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
                    const __m256i H = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
                    c8[4 * n] = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
                    c8[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
                    c8[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(H, m30));
                    c8[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                                    _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
                }
                for (int c = 0; c < 8; c++) {
                    const __m256i v = _mm256_sub_epi8(c8[c], o32);
                    const int8_t *sc = (const int8_t *)blk + 192 + 2 * c;
                    _mm256_store_si256((__m256i *)wq[c][r], _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                                                                               _mm256_set1_epi16(sc[0])));
                    _mm256_store_si256((__m256i *)(wq[c][r] + 16),
                                       _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
                                                          _mm256_set1_epi16(sc[1])));
                    dvs[c][r] = d;
                    mvs[c][r] = 0.0f;
                }
            } else {
                const bool five = kt == NSTF_TYPE_Q5_K;
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk)), dmin = nstf_fp16_to_f32(nstf_load_u16(blk + 2));
                const uint8_t *qs = blk + (five ? 48 : 16);
                __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
                const __m256i m10 = _mm256_set1_epi8(0x10);
                for (int j = 0; j < 4; j++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                    c8[2 * j] = _mm256_and_si256(v, m4);
                    c8[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (five) { /* bits 2j, 2j+1 of each qh byte (hb shifted by 2j so far) */
                        c8[2 * j] = _mm256_or_si256(c8[2 * j], _mm256_and_si256(_mm256_slli_epi16(hb, 4), m10));
                        c8[2 * j + 1] = _mm256_or_si256(c8[2 * j + 1], _mm256_and_si256(_mm256_slli_epi16(hb, 3), m10));
                        hb = _mm256_srli_epi16(hb, 2);
                    }
                }
                for (int c = 0; c < 8; c++) {
                    uint8_t sc, m;
                    nstf_k4_scale_min(c, blk + 4, &sc, &m);
                    _mm256_store_si256((__m256i *)wq[c][r], _mm256_cvtepu8_epi16(_mm256_castsi256_si128(c8[c])));
                    _mm256_store_si256((__m256i *)(wq[c][r] + 16), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(c8[c], 1)));
                    dvs[c][r] = d * (float)sc;
                    mvs[c][r] = -dmin * (float)m;
                }
            }
        }
        for (int g = 0; g < n_full; g++) ktile_tokens(kt, RN_I16, x, t0 + 8 * g, b, wq, dvs, mvs, mhs, accs[g]);
        ktile_tokens(kt, RN, x, t0 + 8 * n_full, b, wq, dvs, mvs, mhs, accs[n_full]);
    }
    for (int g = 0; g < n_full; g++) store_tile(RN_I16, accs[g], rm, y + 8 * g * ldy, ldy);
    store_tile(RN, accs[n_full], rm, y + 8 * n_full * ldy, ldy);
}

/* A tile: rows [0, rm) of w against 8 n_full + RN tokens from t0 (the
 * 32-element types take n_full 0: one group of RN per call). */
typedef void (*tile_fn)(const uint8_t *, uint64_t, int, const xq16 *, int64_t, int, float *, int64_t);
#define DEF_TILE(K, RN, KERN, KIND)                                                                                \
    static void tile_##K##_##RN(const uint8_t *w, uint64_t rb, int rm, const xq16 *x, int64_t t0, int n_full,    \
                                float *y, int64_t ldy) {                                                           \
        (void)n_full;                                                                                              \
        KERN(KIND, RN, w, rb, rm, x, t0, y, ldy);                                                                  \
    }
#define DEF_KTILE(K, RN, KIND)                                                                                     \
    static void tile_##K##_##RN(const uint8_t *w, uint64_t rb, int rm, const xq16 *x, int64_t t0, int n_full,    \
                                float *y, int64_t ldy) {                                                           \
        ktile_avx2(KIND, RN, w, rb, rm, x, t0, n_full, y, ldy);                                                    \
    }
#define DEF_TILES(K, KERN, KIND)                                                                      \
    DEF_TILE(K, 1, KERN, KIND) DEF_TILE(K, 2, KERN, KIND) DEF_TILE(K, 3, KERN, KIND)                  \
    DEF_TILE(K, 4, KERN, KIND) DEF_TILE(K, 5, KERN, KIND) DEF_TILE(K, 6, KERN, KIND)                  \
    DEF_TILE(K, 7, KERN, KIND) DEF_TILE(K, 8, KERN, KIND)
#define DEF_KTILES(K, KIND)                                                                           \
    DEF_KTILE(K, 1, KIND) DEF_KTILE(K, 2, KIND) DEF_KTILE(K, 3, KIND) DEF_KTILE(K, 4, KIND)           \
    DEF_KTILE(K, 5, KIND) DEF_KTILE(K, 6, KIND) DEF_KTILE(K, 7, KIND) DEF_KTILE(K, 8, KIND)
DEF_TILES(Q4_0, tile_avx2, K_Q4_0)
DEF_TILES(Q4_1, tile_avx2, K_Q4_1)
DEF_TILES(Q5_0, tile_avx2, K_Q5_0)
DEF_TILES(Q5_1, tile_avx2, K_Q5_1)
DEF_TILES(Q8_0, tile_avx2, K_Q8_0)
DEF_TILES(IQ4_NL, tile_avx2, K_IQ4_NL)
DEF_KTILES(Q4_K, NSTF_TYPE_Q4_K)
DEF_KTILES(Q5_K, NSTF_TYPE_Q5_K)
DEF_KTILES(Q6_K, NSTF_TYPE_Q6_K)
DEF_KTILES(IQ4_XS, NSTF_TYPE_IQ4_XS)
DEF_KTILES(Q3_K, NSTF_TYPE_Q3_K)
DEF_KTILES(Q2_K, NSTF_TYPE_Q2_K)
#define TILE_ROW(K) {tile_##K##_1, tile_##K##_2, tile_##K##_3, tile_##K##_4, tile_##K##_5, tile_##K##_6, tile_##K##_7, tile_##K##_8},
static const tile_fn k_tiles[N_KINDS][RN_I16] = {TILE_ROW(Q4_0) TILE_ROW(Q4_1) TILE_ROW(Q5_0) TILE_ROW(Q5_1)
                                                     TILE_ROW(Q8_0) TILE_ROW(IQ4_NL)
                                                     TILE_ROW(Q4_K) TILE_ROW(Q5_K) TILE_ROW(Q6_K)
                                                         TILE_ROW(IQ4_XS) TILE_ROW(Q3_K) TILE_ROW(Q2_K)};

static int kind_of(nstf_type t) {
    switch (t) {
    case NSTF_TYPE_Q4_0: return K_Q4_0;
    case NSTF_TYPE_Q4_1: return K_Q4_1;
    case NSTF_TYPE_Q5_0: return K_Q5_0;
    case NSTF_TYPE_Q5_1: return K_Q5_1;
    case NSTF_TYPE_IQ4_NL: return K_IQ4_NL;
    case NSTF_TYPE_Q4_K: return K_Q4_K;
    case NSTF_TYPE_Q5_K: return K_Q5_K;
    case NSTF_TYPE_Q6_K: return K_Q6_K;
    case NSTF_TYPE_IQ4_XS: return K_IQ4_XS;
    case NSTF_TYPE_Q3_K: return K_Q3_K;
    case NSTF_TYPE_Q2_K: return K_Q2_K;
    default: return K_Q8_0;
    }
}
#endif

/* ---- scheduling ----------------------------------------------------------- */

typedef struct {
    nstf_type wtype;
    bool simd;
    const uint8_t *w;
    uint64_t row_bytes;
    const float *x;
    xq16 xq;
    float *y;
    int64_t n_tok, n_in, n_out;
} i16_ctx;

static void quantize_worker(void *p, int ith, int nth) {
    const i16_ctx *c = p;
    int64_t lo, hi, nb = c->xq.nb;
    nstf_split_range(c->n_tok, 1, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        nstf_i16_quantize_row(c->x + t * c->n_in, c->xq.q + t * nb * QK, c->xq.d + t * nb, c->xq.s + t * nb,
                              c->xq.sl + t * nb, c->xq.sh + t * nb, nb);
}

/* Rows [r0, r0 + 8) against tokens [t0, t_end), at most TOK_CHUNK: the
 * super-block types in one tile call (a super-block decoded once for all
 * of them), the others a tile per 8 tokens. */
static void run_tiles(const i16_ctx *c, int64_t r0, int64_t t0, int64_t t_end) {
    const int rm = (int)(c->n_out - r0 < 8 ? c->n_out - r0 : 8);
    const uint8_t *w = c->w + (uint64_t)r0 * c->row_bytes;
#if NSTF_CPU_HAVE_AVX2
    if (c->simd && is_k(c->wtype)) {
        const int n = (int)(t_end - t0), n_full = (n - 1) / RN_I16;
        k_tiles[kind_of(c->wtype)][n - RN_I16 * n_full - 1](w, c->row_bytes, rm, &c->xq, t0, n_full,
                                                             c->y + t0 * c->n_out + r0, c->n_out);
        return;
    }
#endif
    for (; t0 < t_end; t0 += RN_I16) {
        const int rn = (int)(t_end - t0 < RN_I16 ? t_end - t0 : RN_I16);
        float *y = c->y + t0 * c->n_out + r0;
#if NSTF_CPU_HAVE_AVX2
        if (c->simd) {
            k_tiles[kind_of(c->wtype)][rn - 1](w, c->row_bytes, rm, &c->xq, t0, 0, y, c->n_out);
            continue;
        }
#endif
        if (is_k(c->wtype))
            ktile_scalar(c->wtype, w, c->row_bytes, rm, &c->xq, t0, rn, y, c->n_out);
        else
            tile_scalar(c->wtype, w, c->row_bytes, rm, &c->xq, t0, rn, y, c->n_out);
    }
}

/* Row tiles split over the threads (each keeps its rows hot) unless there
 * are too few of them; tokens in chunks of TOK_CHUNK so a chunk's blocks
 * stay in L1 while the thread's rows pass over them. */
static void mm_worker(void *p, int ith, int nth) {
    const i16_ctx *c = p;
    const int64_t n_rt = (c->n_out + 7) / 8;
    int64_t r_lo = 0, r_hi = n_rt, t_lo = 0, t_hi = c->n_tok;
    if (n_rt >= 4 * nth || c->n_tok < 2 * nth * RN_I16)
        nstf_split_range(n_rt, 1, ith, nth, &r_lo, &r_hi);
    else
        nstf_split_range(c->n_tok, RN_I16, ith, nth, &t_lo, &t_hi);
    for (int64_t tc = t_lo; tc < t_hi; tc += TOK_CHUNK) {
        const int64_t tc_hi = tc + TOK_CHUNK < t_hi ? tc + TOK_CHUNK : t_hi;
        for (int64_t rt = r_lo; rt < r_hi; rt++) run_tiles(c, rt * 8, tc, tc_hi);
    }
}

void nstf_i16_matmul(nstf_pool *pool, nstf_type wtype, const void *w, const float *x, float *y, int64_t n_tok,
                     int64_t n_in, int64_t n_out, void *arena) {
    i16_ctx c = {.wtype = wtype, .simd = nstf_cpu_isa_current() != NSTF_ISA_SCALAR, .w = w, .x = x, .y = y,
                 .n_tok = n_tok, .n_in = n_in, .n_out = n_out};
    nstf_type_row_bytes(wtype, n_in, &c.row_bytes);
    carve(arena, n_tok, n_in, &c.xq);
    if (n_tok < 8 || !pool || nstf_pool_size(pool) == 1)
        quantize_worker(&c, 0, 1);
    else
        nstf_pool_run(pool, quantize_worker, &c);
    nstf_pool_run(pool, mm_worker, &c);
}
