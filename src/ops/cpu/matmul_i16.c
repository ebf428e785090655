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
 * output is computed the same way whatever the split. The tiles are
 * compiled twice (matmul_i16_tiles.h): for the build's AVX2, and with
 * AVX-512 VNNI's vpdpwssd folding the second vpmaddwd and the add (chosen
 * at run time, the same bits). A portable scalar tile computes the same
 * integers (fp32 rounding may differ). */
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

/* Bytes of one block of a 32-element kind. */
static ALWAYS_INLINE int bytes32(const int kind) {
    return kind == K_Q4_0 || kind == K_IQ4_NL ? 18 : kind == K_Q4_1 ? 20 : kind == K_Q5_0 ? 22 : kind == K_Q5_1 ? 24 : 34;
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

/* A tile: rows [0, rm) of w against 8 n_full + RN tokens from t0 (the
 * 32-element types take n_full 0: one group of RN per call). */
typedef void (*tile_fn)(const uint8_t *, uint64_t, int, const xq16 *, int64_t, int, float *, int64_t);

#define I16FN(name) name##_avx2
#define I16TARGET
#define I16_IL 0
#define MADD2(a, x, b, y) _mm256_add_epi32(_mm256_madd_epi16(a, x), _mm256_madd_epi16(b, y))
#include "ops/cpu/matmul_i16_tiles.h"
#undef I16FN
#undef I16TARGET
#undef I16_IL
#undef MADD2
/* The VNNI copy of the tiles: not in sanitizer builds, where this file's
 * tiles already take the compiler many minutes (the AVX2 tiles there
 * touch memory exactly as these do, and test_matmul_cpu checks the two
 * bit for bit in the other builds). */
#if defined(__SANITIZE_ADDRESS__)
#define I16_VNNI 0
#else
#define I16_VNNI NSTF_CPU_HAVE_AVX512
#endif
#if I16_VNNI
#define I16FN(name) name##_vnni
#define I16TARGET NSTF_TARGET_AVX512VNNI
#define I16_IL 1
#define MADD2(a, x, b, y) _mm256_dpwssd_epi32(_mm256_madd_epi16(a, x), b, y)
#include "ops/cpu/matmul_i16_tiles.h"
#undef I16FN
#undef I16TARGET
#undef I16_IL
#undef MADD2
#endif

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
    bool simd, vnni; /* vnni: the AVX-512 level with VNNI (vpdpwssd) */
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
#if I16_VNNI
    const tile_fn(*k_tiles)[RN_I16] = c->vnni ? k_tiles_vnni : k_tiles_avx2;
#else
    const tile_fn(*k_tiles)[RN_I16] = k_tiles_avx2;
#endif
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
    const nstf_cpu_isa isa = nstf_cpu_isa_current();
    i16_ctx c = {.wtype = wtype, .simd = isa != NSTF_ISA_SCALAR, .vnni = isa == NSTF_ISA_AVX512 && nstf_cpu_has_vnni(),
                 .w = w, .x = x, .y = y, .n_tok = n_tok, .n_in = n_in, .n_out = n_out};
    nstf_type_row_bytes(wtype, n_in, &c.row_bytes);
    carve(arena, n_tok, n_in, &c.xq);
    if (n_tok < 8 || !pool || nstf_pool_size(pool) == 1)
        quantize_worker(&c, 0, 1);
    else
        nstf_pool_run(pool, quantize_worker, &c);
    nstf_pool_run(pool, mm_worker, &c);
}
