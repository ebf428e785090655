/* matmul.c — the fast CPU matmul y[t, o] = sum_i W[o, i] * x[t, i], and the
 * nstf_cpu scratch arena (nstf_cpu_reserve / nstf_cpu_release).
 *
 * Quantized weights are used as stored. The 256-element super-block types
 * (Q2_K..Q6_K, IQ4_XS) are computed by matmul_k.c against "q8k"
 * activation blocks of 256 (matmul_k.h); this file schedules them like the
 * rest. For the 32-element types, once per call the activations are
 * quantized into the scratch arena as "q8 blocks" of 32
 * (int8 q[32], fp32 d = amax / 127, fp32 s = d * sum(q)) — ggml's q8_1 with
 * fp32 scales — and every weight block meets them in an integer dot product:
 *   Q4_1 / Q5_1 (d, m, q):  d*dx*sum(q*xq) + m*s
 *   Q4_0 / Q5_0 (d, q):     d*dx*(sum(q*xq) - 8*sum(xq))  (16 for Q5_0; exact in int32)
 *   Q8_0 (d, int8 q):       d*dx*sum(q*xq)             (sign trick, below)
 *   IQ4_NL (d, 4-bit code): d*dx*sum(kv[code]*xq)      (table shuffle, sign trick)
 * with AVX2 _mm256_maddubs_epi16 (unsigned x signed bytes -> int16 pairs)
 * and _mm256_madd_epi16 (-> int32), one fp32 FMA per block. The 4-bit
 * products are at most 2*15*127 = 3810 per int16 lane, 5-bit 2*31*127 =
 * 7874, and the Q8_0 / IQ4_NL ones at most 2*128*127 = 32512, so maddubs
 * never saturates. Quantized n_in must be a multiple of the block (a GGUF
 * row always is); otherwise y is filled with NaN.
 *
 * SIMD level (cpu_isa.h): the scalar tiles, the AVX2 tiles, and the same
 * AVX2 tiles compiled for AVX-512 (VL/BW/DQ: EVEX, 32 vector registers) are
 * all built; the level is chosen at run time and can be forced.
 *
 * Work is cut into tiles of up to RM weight rows x RN tokens computed in
 * registers, so a weight block is unpacked once and reused across RN tokens
 * (prefill) and a token's block across RM rows. Tiles are numbered
 * row-tile-major and the two (or more) threads take equal contiguous runs,
 * so a thread keeps its weight rows hot while it walks the tokens.
 *
 * F32 / F16 / BF16 weights are converted 8 at a time (F16C, shift for BF16)
 * and meet the unquantized fp32 x in FMA dot products; any n_in.
 *
 * Scratch contract: nstf_cpu_reserve(cpu, n_tok, n_in) makes every later
 * nstf_cpu_matmul with n_tok' * ceil(n_in' / 32) <= n_tok * ceil(n_in / 32)
 * run the fast path. A call with a larger shape (or a NULL/short arena) still
 * gives the right answer through a slower path that dequantizes weight blocks
 * on the fly and uses fp32 x (no activation quantization), and allocates
 * nothing. nstf_cpu_matmul never allocates. */
#include <math.h>
#include <string.h>

#include "core/mem.h"
#include "ops/cpu/cpu_isa.h"
#include "ops/cpu/matmul_k.h"
#include "ops/cpu/q32_simd.h"
#include "ops/ops.h"

#define NSTF_MATMUL_AVX2 NSTF_CPU_HAVE_AVX2
#if NSTF_MATMUL_AVX2
#include <immintrin.h>
#endif

#define QK NSTF_QK
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* ---- scratch ------------------------------------------------------------- */

/* Layout of quantized activations in the arena: q [n_tok][nb][32] int8,
 * then d [n_tok][nb] fp32, s [n_tok][nb] fp32 (d * sum(q)) and
 * sum [n_tok][nb] int32 (sum(q)), each 64-byte aligned. */
typedef struct {
    int8_t *q;
    float *d, *s;
    int32_t *sum;
    int64_t nb; /* blocks per token */
} xq_buf;

static bool xq_bytes(int64_t n_tok, int64_t n_in, uint64_t *out) {
    if (n_tok < 0 || n_in < 0) return false;
    uint64_t nb = ((uint64_t)n_in + QK - 1) / QK, blocks, q, f;
    if (!nstf_mul_ok((uint64_t)n_tok, nb, &blocks)) return false;
    if (!nstf_mul_ok(blocks, QK, &q) || !nstf_mul_ok(blocks, 4, &f)) return false;
    q = (q + 63) & ~(uint64_t)63;
    f = (f + 63) & ~(uint64_t)63;
    uint64_t total;
    if (!nstf_add_ok(q, f, &total) || !nstf_add_ok(total, f, &total) ||
        !nstf_add_ok(total, f, &total))
        return false;
    return nstf_add_ok(total, 64, out); /* + slack so a tile may read past the end */
}

static bool xq_carve(nstf_cpu *cpu, int64_t n_tok, int64_t n_in, xq_buf *b) {
    uint64_t need;
    if (!cpu || !cpu->scratch || !xq_bytes(n_tok, n_in, &need) || need > cpu->scratch_bytes)
        return false;
    int64_t nb = (n_in + QK - 1) / QK;
    uint64_t q = ((uint64_t)(n_tok * nb * QK) + 63) & ~(uint64_t)63;
    uint64_t f = ((uint64_t)(n_tok * nb * 4) + 63) & ~(uint64_t)63;
    char *base = cpu->scratch;
    b->q = (int8_t *)base;
    b->d = (float *)(base + q);
    b->s = (float *)(base + q + f);
    b->sum = (int32_t *)(base + q + 2 * f);
    b->nb = nb;
    return true;
}

nstf_status nstf_cpu_reserve(nstf_cpu *cpu, int64_t n_tok, int64_t n_in) {
    if (!cpu) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_cpu_reserve: cpu is NULL");
    uint64_t need;
    if (!xq_bytes(n_tok, n_in, &need) || need > SIZE_MAX)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_cpu_reserve: bad or overflowing shape n_tok=%lld n_in=%lld",
                              (long long)n_tok, (long long)n_in);
    if (need <= cpu->scratch_bytes) return NSTF_OK;
    void *p = nstf_alloc((size_t)need, "cpu scratch arena");
    if (!p) return NSTF_ERR_OOM;
    nstf_free(cpu->scratch);
    cpu->scratch = p;
    cpu->scratch_bytes = (size_t)need;
    return NSTF_OK;
}

void nstf_cpu_release(nstf_cpu *cpu) {
    if (!cpu) return;
    nstf_free(cpu->scratch);
    cpu->scratch = NULL;
    cpu->scratch_bytes = 0;
}

/* ---- activation quantization ----------------------------------------------
 * Per block of 32: amax = max|x|, d = amax / 127, id = 127 / amax (0 if
 * amax == 0), q = round-half-even(x * id), s = d * sum(q). The AVX2 and
 * scalar versions compute bit-identical results. */
static void quantize_x_row(const float *x, int8_t *q, float *d, float *s, int32_t *sum,
                           int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK;
#if NSTF_MATMUL_AVX2
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float dd = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)); /* MXCSR: nearest-even */
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        __m256i vs = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(vs), _mm256_extracti128_si256(vs, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        int isum = _mm_cvtsi128_si32(s4);
        /* packs interleave 128-bit lanes; the permute restores element order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + b * QK), p);
#else
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float dd = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int isum = 0;
        for (int j = 0; j < QK; j++) {
            int v = (int)nearbyintf(xb[j] * id);
            q[b * QK + j] = (int8_t)v;
            isum += v;
        }
#endif
        d[b] = dd;
        s[b] = dd * (float)isum;
        sum[b] = isum;
    }
}

bool nstf_cpu_act_residual(nstf_type wtype, const float *x, float *r, int64_t n_in) {
    if (!nstf_type_is_quantized(wtype) || n_in < 0) return false;
    if (nstf_mmk_type(wtype)) { /* q8k blocks of 256, the super-block kernels' quantizer */
        if (n_in % NSTF_QK_K != 0) return false;
        for (int64_t b = 0; x && b < n_in / NSTF_QK_K; b++) {
            int8_t q[NSTF_QK_K];
            float d;
            int16_t bsums[NSTF_QK_K / 16];
            const nstf_q8k one = {q, &d, bsums, 1};
            nstf_mmk_quantize_row(x + b * NSTF_QK_K, &one, 0);
            for (int j = 0; j < NSTF_QK_K; j++) r[b * NSTF_QK_K + j] = x[b * NSTF_QK_K + j] - d * (float)q[j];
        }
        return true;
    }
    if (n_in % QK != 0) return false;
    for (int64_t b = 0; x && b < n_in / QK; b++) {
        int8_t q[QK];
        float d, s;
        int32_t sum;
        quantize_x_row(x + b * QK, q, &d, &s, &sum, 1);
        for (int j = 0; j < QK; j++) r[b * QK + j] = x[b * QK + j] - d * (float)q[j];
    }
    return true;
}

/* ---- tiles ----------------------------------------------------------------
 * A tile computes y[t0 + t, r0 + r] for r < rm <= RM, t < rn <= RN. */

typedef struct {
    nstf_type wtype;
    nstf_cpu_isa isa;
    int path, kind;   /* PATH_*; the tile table's kind (decided once per call) */
    const uint8_t *w; /* [n_out] rows of row_bytes */
    uint64_t row_bytes;
    const float *x; /* [n_tok, n_in] */
    xq_buf xq;      /* quantized x (32-element wtypes, fast path) */
    nstf_q8k xk;    /* quantized x (super-block wtypes, fast path) */
    float *y;       /* [n_tok, n_out] */
    int64_t n_tok, n_in, n_out;
    int rm, rn;     /* tile shape */
    bool vnni;      /* AVX-512 with VNNI: the interleaved tiles of 3 and 4 tokens */
} mm_ctx;

enum { KIND_Q4_0, KIND_Q4_1, KIND_Q8_0, KIND_Q5_0, KIND_Q5_1, KIND_IQ4_NL, N_QKINDS };
enum { KIND_F32, KIND_F16, KIND_BF16 };

#define RM_Q 8 /* rows per quantized tile: the 8 lanes of a vector */
#define RN_Q 4
#define RN_QIL 8 /* tokens of the VNNI interleaved tiles (3 .. RN_QIL) */
#define RM_F 4
#define RN_F 2

#if NSTF_MATMUL_AVX2

static ALWAYS_INLINE float fp16_load(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Sums of four vectors -> one __m128 {sum a, sum b, sum c, sum d}. */
static ALWAYS_INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
static ALWAYS_INLINE float hsum1(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Store acc[r][t] (lane sums) to y; RM == 4 writes 4 rows of a token at once. */
#define STORE_TILE(RM_, RN_, acc, y, ldy)                                                   \
    do {                                                                                    \
        _Pragma("GCC unroll 4") for (int t = 0; t < (RN_); t++) {                           \
            if ((RM_) == 4) {                                                               \
                _mm_storeu_ps((y) + t * (ldy),                                              \
                              hsum4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));           \
            } else {                                                                        \
                _Pragma("GCC unroll 4") for (int r = 0; r < (RM_); r++)(y)[t * (ldy) + r] = \
                    hsum1(acc[r][t]);                                                       \
            }                                                                               \
        }                                                                                   \
    } while (0)

/* Quantized tile: 8 weight rows x RN tokens. Lane r of every vector belongs
 * to weight row r (rows past rm repeat row rm - 1 and are not stored), so
 * the per-block scales of the 8 rows form one vector and each token's 8
 * results are stored with one (masked) store. Per block and token the 8
 * rows' maddubs results are summed to one int32 lane each by a hadd tree:
 * for 4-bit weights in int16 (|sum of 16 products| <= 16*15*127 = 30480
 * fits), for Q8_0 after _mm256_madd_epi16 in int32. */
/* Sum of 2 vectors' halves, interleaved: unpack{lo,hi} + add is cheaper than
 * vphaddw here (measured on Zen 3: hadd ~1/cycle, unpack/add 3-4/cycle). */
static ALWAYS_INLINE __m256i fold16(__m256i a, __m256i b) {
    return _mm256_add_epi16(_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
}
static ALWAYS_INLINE __m256i fold32(__m256i a, __m256i b) {
    return _mm256_add_epi16(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
static ALWAYS_INLINE __m256i fold64(__m256i a, __m256i b) {
    return _mm256_add_epi16(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}
static ALWAYS_INLINE __m256i reduce8_q4(const __m256i p[8]) {
    /* per 128-bit half, int16 lanes after each level: rows (0,1)x4, (0..3)x2, (0..7)x1 */
    __m256i c = fold64(fold32(fold16(p[0], p[1]), fold16(p[2], p[3])),
                       fold32(fold16(p[4], p[5]), fold16(p[6], p[7])));
    /* the two 128-bit halves hold partial sums of rows 0..7: widen and add */
    return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(c)),
                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(c, 1)));
}
static ALWAYS_INLINE __m256i reduce8_q8(const __m256i p[8]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i q[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) q[r] = _mm256_madd_epi16(p[r], ones);
    return nstf_q32_reduce8_i32(q);
}

/* Bytes of one block of a kind. */
static ALWAYS_INLINE int qblock_bytes(const int kind) {
    return kind == KIND_Q4_1 ? 20 : kind == KIND_Q8_0 ? 34 : kind == KIND_Q5_0 ? 22 : kind == KIND_Q5_1 ? 24 : 18;
}

/* The 32 codes of a block: unsigned for the 4- and 5-bit kinds, signed
 * for Q8_0 and IQ4_NL (its table's values, iq4_table). */
static ALWAYS_INLINE __m256i quant_codes(const int kind, const uint8_t *bl, __m256i iq4_table) {
    if (kind == KIND_Q8_0) return _mm256_loadu_si256((const __m256i *)(bl + 2));
    if (kind == KIND_IQ4_NL) return _mm256_shuffle_epi8(iq4_table, nstf_q32_nibbles(bl + 2));
    if (kind == KIND_Q5_0 || kind == KIND_Q5_1) {
        const uint8_t *q = bl + (kind == KIND_Q5_1 ? 4 : 2);
        uint32_t qh;
        memcpy(&qh, q, 4);
        return _mm256_or_si256(nstf_q32_nibbles(q + 4), _mm256_and_si256(nstf_q32_bits(qh), _mm256_set1_epi8(0x10)));
    }
    return nstf_q32_nibbles(bl + (kind == KIND_Q4_1 ? 4 : 2));
}

/* acc[t] lane r -> y[t * ldy + r] for r < rm. */
static ALWAYS_INLINE void store_qtile(const int RN, const __m256 *acc, int rm, float *y, int64_t ldy) {
    if (rm == 8) {
#pragma GCC unroll 4
        for (int t = 0; t < RN; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);
    } else {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(rm),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
        for (int t = 0; t < RN; t++) _mm256_maskstore_ps(y + t * ldy, mask, acc[t]);
    }
}

static ALWAYS_INLINE void tile_quant(const int kind, const int RN, const uint8_t *w,
                                     uint64_t row_bytes, int rm, const int8_t *xq,
                                     const float *xd, const float *xs, const int32_t *xsum,
                                     int64_t nb, float *y, int64_t ldy) {
    const int bbytes = qblock_bytes(kind);
    /* 5-bit codes and signed table values sum past int16 over 16 products:
     * those kinds widen to int32 per pair like Q8_0 */
    const bool wide = kind == KIND_Q8_0 || kind == KIND_Q5_0 || kind == KIND_Q5_1 || kind == KIND_IQ4_NL;
    const bool has_m = kind == KIND_Q4_1 || kind == KIND_Q5_1;
    const bool sgn = kind == KIND_Q8_0 || kind == KIND_IQ4_NL; /* signed weights: sign trick */
    const __m256i iq4_table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nstf_iq4nl_values));
    const uint8_t *wr[8];
    nstf_q32_rows8(w, row_bytes, rm, wr);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < RN; t++) acc[t] = _mm256_setzero_ps();

    /* Decode (RN == 1, or 2: a token's 16-bit activation rows, matmul_a16.c)
     * streams weights from DRAM: prefetch the next 8 rows (the next tile)
     * at the pace this tile consumes its own, 8 blocks per step, so the
     * memory system runs ahead of the arithmetic. */
    const uint8_t *pf = w + 8 * row_bytes;
    for (int64_t b = 0; b < nb; b++) {
        const uint64_t off = (uint64_t)b * bbytes;
        if (RN <= 2) {
            nstf_q32_prefetch(pf, 8 * bbytes);
            pf += 8 * bbytes;
        }
        /* scales of the 8 rows: first 4 bytes of each block (d, and m for Q4_1) */
        __m256 mv = _mm256_setzero_ps();
        const __m256 dv = nstf_q32_scales8(wr, off, has_m, &mv);

        __m256i wv[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) wv[r] = quant_codes(kind, wr[r] + off, iq4_table);
#pragma GCC unroll 4
        for (int t = 0; t < RN; t++) {
            const __m256i xv = _mm256_load_si256((const __m256i *)(xq + (t * nb + b) * QK));
            __m256i p[8], isum;
            if (sgn) {
#pragma GCC unroll 8
                for (int r = 0; r < 8; r++)
                    p[r] = _mm256_maddubs_epi16(_mm256_sign_epi8(wv[r], wv[r]),
                                                _mm256_sign_epi8(xv, wv[r]));
            } else {
#pragma GCC unroll 8
                for (int r = 0; r < 8; r++) p[r] = _mm256_maddubs_epi16(wv[r], xv);
            }
            isum = wide ? reduce8_q8(p) : reduce8_q4(p);
            if (kind == KIND_Q4_0 || kind == KIND_Q5_0) /* q - 8 (q - 16): subtract 8 (16) * sum(xq), exactly */
                isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_set1_epi32(xsum[t * nb + b]),
                                                                kind == KIND_Q4_0 ? 3 : 4));
            __m256 dd = _mm256_mul_ps(dv, _mm256_broadcast_ss(xd + t * nb + b));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[t]);
            if (has_m)
                acc[t] = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(xs + t * nb + b), acc[t]);
        }
    }
    store_qtile(RN, acc, rm, y, ldy);
}

static ALWAYS_INLINE __m256 load8_w(const int kind, const uint8_t *row, int64_t i) {
    if (kind == KIND_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (kind == KIND_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

#endif /* NSTF_MATMUL_AVX2 */

static inline float load1_w(nstf_type wtype, const uint8_t *row, int64_t i) {
    uint16_t h;
    switch (wtype) {
    case NSTF_TYPE_F16: memcpy(&h, row + 2 * i, 2); return nstf_fp16_to_f32(h);
    case NSTF_TYPE_BF16: memcpy(&h, row + 2 * i, 2); return nstf_bf16_to_f32(h);
    default: {
        float f;
        memcpy(&f, row + 4 * i, 4);
        return f;
    }
    }
}

#if NSTF_MATMUL_AVX2
static ALWAYS_INLINE void tile_float(const int kind, const int RM, const int RN,
                                     nstf_type wtype, const uint8_t *w, uint64_t row_bytes,
                                     const float *x, int64_t n_in, float *y, int64_t ldy) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t n8 = n_in & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < RN; t++) xv[t] = _mm256_loadu_ps(x + t * n_in + i);
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            __m256 wv = load8_w(kind, w + r * row_bytes, i);
#pragma GCC unroll 4
            for (int t = 0; t < RN; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    STORE_TILE(RM, RN, acc, y, ldy);
    if (n8 < n_in) {
        for (int t = 0; t < RN; t++)
            for (int r = 0; r < RM; r++) {
                float s = 0.0f;
                for (int64_t i = n8; i < n_in; i++)
                    s += load1_w(wtype, w + r * row_bytes, i) * x[t * n_in + i];
                y[t * ldy + r] += s;
            }
    }
}
#endif

/* ---- portable scalar tiles (also the model of the SIMD arithmetic) -------- */
static void tile_quant_scalar(nstf_type wtype, int rm, int rn, const uint8_t *w,
                              uint64_t row_bytes, const int8_t *xq, const float *xd,
                              const float *xs, const int32_t *xsum, int64_t nb, float *y,
                              int64_t ldy) {
    for (int r = 0; r < rm; r++)
        for (int t = 0; t < rn; t++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const int8_t *xb = xq + (t * nb + b) * QK;
                float dx = xd[t * nb + b], sx = xs[t * nb + b];
                int isum = 0;
                /* byte offsets, not block structs: rows may be unaligned */
                const uint8_t *bl = w + r * row_bytes + (uint64_t)b * (uint64_t)nstf_type_block_bytes(wtype);
                const float wd = nstf_fp16_to_f32(nstf_load_u16(bl));
                if (wtype == NSTF_TYPE_Q8_0) {
                    const int8_t *qs = (const int8_t *)(bl + 2);
                    for (int j = 0; j < QK; j++) isum += qs[j] * xb[j];
                    acc += (float)isum * (wd * dx);
                } else if (wtype == NSTF_TYPE_Q4_1) {
                    const uint8_t *qs = bl + 4;
                    for (int j = 0; j < QK / 2; j++)
                        isum += (qs[j] & 0x0f) * xb[j] + (qs[j] >> 4) * xb[j + 16];
                    acc += (float)isum * (wd * dx) + nstf_fp16_to_f32(nstf_load_u16(bl + 2)) * sx;
                } else if (wtype == NSTF_TYPE_Q5_0 || wtype == NSTF_TYPE_Q5_1) {
                    const bool q51 = wtype == NSTF_TYPE_Q5_1;
                    uint32_t qh;
                    memcpy(&qh, bl + (q51 ? 4 : 2), 4);
                    const uint8_t *qs = bl + (q51 ? 8 : 6);
                    for (int j = 0; j < QK / 2; j++)
                        isum += ((qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4)) * xb[j] +
                                ((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) * xb[j + 16];
                    if (q51) {
                        acc += (float)isum * (wd * dx) + nstf_fp16_to_f32(nstf_load_u16(bl + 2)) * sx;
                    } else {
                        isum -= 16 * xsum[t * nb + b];
                        acc += (float)isum * (wd * dx);
                    }
                } else if (wtype == NSTF_TYPE_IQ4_NL) {
                    const uint8_t *qs = bl + 2;
                    for (int j = 0; j < QK / 2; j++)
                        isum += nstf_iq4nl_values[qs[j] & 0x0f] * xb[j] + nstf_iq4nl_values[qs[j] >> 4] * xb[j + 16];
                    acc += (float)isum * (wd * dx);
                } else {
                    const uint8_t *qs = bl + 2;
                    for (int j = 0; j < QK / 2; j++)
                        isum += (qs[j] & 0x0f) * xb[j] + (qs[j] >> 4) * xb[j + 16];
                    isum -= 8 * xsum[t * nb + b];
                    acc += (float)isum * (wd * dx);
                }
            }
            y[t * ldy + r] = acc;
        }
}

static void tile_float_scalar(nstf_type wtype, int rm, int rn, const uint8_t *w,
                              uint64_t row_bytes, const float *x, int64_t n_in, float *y,
                              int64_t ldy) {
    for (int r = 0; r < rm; r++)
        for (int t = 0; t < rn; t++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < n_in; i++)
                acc += load1_w(wtype, w + r * row_bytes, i) * x[t * n_in + i];
            y[t * ldy + r] = acc;
        }
}

/* ---- tile dispatch --------------------------------------------------------- */
#if NSTF_MATMUL_AVX2
typedef void (*qtile_fn)(const uint8_t *, uint64_t, int, const int8_t *, const float *,
                         const float *, const int32_t *, int64_t, float *, int64_t);
typedef void (*ftile_fn)(const uint8_t *, uint64_t, const float *, int64_t, float *, int64_t);

#define DEF_QTILE(K, RN)                                                                     \
    static void qtile_##K##_##RN(const uint8_t *w, uint64_t rb, int rm, const int8_t *xq,    \
                                 const float *xd, const float *xs, const int32_t *xsum,      \
                                 int64_t nb, float *y, int64_t ldy) {                        \
        tile_quant(KIND_##K, RN, w, rb, rm, xq, xd, xs, xsum, nb, y, ldy);                   \
    }
#define DEF_QTILES_K(K) DEF_QTILE(K, 1) DEF_QTILE(K, 2) DEF_QTILE(K, 3) DEF_QTILE(K, 4)
#define DEF_QTILES_ALL(D) D(Q4_0) D(Q4_1) D(Q8_0) D(Q5_0) D(Q5_1) D(IQ4_NL)
DEF_QTILES_ALL(DEF_QTILES_K)
#define QTILE_TAB(K) {qtile_##K##_1, qtile_##K##_2, qtile_##K##_3, qtile_##K##_4},
static const qtile_fn k_qtiles[N_QKINDS][RN_Q] = {DEF_QTILES_ALL(QTILE_TAB)};
#if NSTF_CPU_HAVE_AVX512
/* the same tiles compiled for AVX-512 (EVEX encodings, 32 registers) */
#define DEF_QTILE512(K, RN)                                                                  \
    static NSTF_TARGET_AVX512 void qtile512_##K##_##RN(                                     \
        const uint8_t *w, uint64_t rb, int rm, const int8_t *xq, const float *xd,            \
        const float *xs, const int32_t *xsum, int64_t nb, float *y, int64_t ldy) {           \
        tile_quant(KIND_##K, RN, w, rb, rm, xq, xd, xs, xsum, nb, y, ldy);                   \
    }
#define DEF_QTILES512_K(K) DEF_QTILE512(K, 1) DEF_QTILE512(K, 2) DEF_QTILE512(K, 3) DEF_QTILE512(K, 4)
DEF_QTILES_ALL(DEF_QTILES512_K)
#define QTILE512_TAB(K) {qtile512_##K##_1, qtile512_##K##_2, qtile512_##K##_3, qtile512_##K##_4},
static const qtile_fn k_qtiles512[N_QKINDS][RN_Q] = {DEF_QTILES_ALL(QTILE512_TAB)};

/* With VNNI, 3 to 8 tokens take the rows interleaved: a block's 32 codes
 * of the 8 rows are transposed by groups of 4 (int32 lane r of W[g] = row
 * r's codes 4g .. 4g + 3), so one vpdpbusd with a token's 4 bytes
 * broadcast adds that group for all 8 rows; a token's 8 sums come out in
 * lanes, with no reduction tree. vpdpbusd takes unsigned codes: the signed
 * ones (Q8_0, IQ4_NL's table values) go in as c + 128 and 128 sum(xq) is
 * taken back, as Q4_0's 8 sum(xq). The same integer sums as tile_quant's
 * (exact) and the same float steps: the same bits. */
static NSTF_TARGET_AVX512VNNI ALWAYS_INLINE void tile_quant_il(const int kind, const int RN, const uint8_t *w,
                                                                uint64_t row_bytes, int rm, const int8_t *xq,
                                                                const float *xd, const float *xs,
                                                                const int32_t *xsum, int64_t nb, float *y,
                                                                int64_t ldy) {
    const int bbytes = qblock_bytes(kind);
    const bool has_m = kind == KIND_Q4_1 || kind == KIND_Q5_1;
    const bool sgn = kind == KIND_Q8_0 || kind == KIND_IQ4_NL;
    /* the codes' offset, taken back as a multiple of sum(xq): log2 of 8, 16, 128 */
    const int shift = kind == KIND_Q4_0 ? 3 : kind == KIND_Q5_0 ? 4 : sgn ? 7 : 0;
    const __m256i iq4_table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nstf_iq4nl_values));
    const uint8_t *wr[8];
    nstf_q32_rows8(w, row_bytes, rm, wr);
    __m256 acc[RN_QIL];
#pragma GCC unroll 8
    for (int t = 0; t < RN; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint64_t off = (uint64_t)b * bbytes;
        __m256 mv = _mm256_setzero_ps();
        const __m256 dv = nstf_q32_scales8(wr, off, has_m, &mv);
        __m256i v[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            v[r] = quant_codes(kind, wr[r] + off, iq4_table);
            if (sgn) v[r] = _mm256_xor_si256(v[r], _mm256_set1_epi8((char)0x80)); /* c + 128 */
        }
        __m256i W[8]; /* v[r] lane g -> W[g] lane r */
        nstf_q32_tr8(v, W);
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) {
            const int8_t *xb = xq + (t * nb + b) * QK;
            __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                int32_t x4;
                memcpy(&x4, xb + 4 * g, 4);
                isum = _mm256_dpbusd_epi32(isum, W[g], _mm256_set1_epi32(x4));
            }
            if (shift) /* the codes' offset (8, 16 or 128) times sum(xq), taken back exactly */
                isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_set1_epi32(xsum[t * nb + b]), shift));
            __m256 dd = _mm256_mul_ps(dv, _mm256_broadcast_ss(xd + t * nb + b));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[t]);
            if (has_m) acc[t] = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(xs + t * nb + b), acc[t]);
        }
    }
    store_qtile(RN, acc, rm, y, ldy);
}
#define DEF_QTILE_IL(K, RN)                                                                          \
    static NSTF_TARGET_AVX512VNNI void qtile_il_##K##_##RN(const uint8_t *w, uint64_t rb, int rm,      \
                                                           const int8_t *xq, const float *xd,         \
                                                           const float *xs, const int32_t *xsum,      \
                                                           int64_t nb, float *y, int64_t ldy) {       \
        tile_quant_il(KIND_##K, RN, w, rb, rm, xq, xd, xs, xsum, nb, y, ldy);                         \
    }
#define DEF_QTILES_IL_K(K)                                                                   \
    DEF_QTILE_IL(K, 3) DEF_QTILE_IL(K, 4) DEF_QTILE_IL(K, 5) DEF_QTILE_IL(K, 6) DEF_QTILE_IL(K, 7) \
    DEF_QTILE_IL(K, 8)
DEF_QTILES_ALL(DEF_QTILES_IL_K)
#define QTILE_IL_TAB(K) {qtile_il_##K##_3, qtile_il_##K##_4, qtile_il_##K##_5, qtile_il_##K##_6, qtile_il_##K##_7, \
                         qtile_il_##K##_8},
/* [kind][rn - 3] */
static const qtile_fn k_qtiles_il[N_QKINDS][RN_QIL - 2] = {DEF_QTILES_ALL(QTILE_IL_TAB)};
#endif

#define DEF_FTILE(K, RM, RN)                                                                 \
    static void ftile_##K##_##RM##_##RN(const uint8_t *w, uint64_t rb, const float *x,       \
                                        int64_t n_in, float *y, int64_t ldy) {               \
        tile_float(KIND_##K, RM, RN, NSTF_TYPE_##K, w, rb, x, n_in, y, ldy);                 \
    }
#define DEF_FTILES_K(K)                                                                      \
    DEF_FTILE(K, 1, 1) DEF_FTILE(K, 1, 2) DEF_FTILE(K, 2, 1) DEF_FTILE(K, 2, 2)              \
    DEF_FTILE(K, 3, 1) DEF_FTILE(K, 3, 2) DEF_FTILE(K, 4, 1) DEF_FTILE(K, 4, 2)
DEF_FTILES_K(F32)
DEF_FTILES_K(F16)
DEF_FTILES_K(BF16)
#define FTILE_ROW(K, RM) {ftile_##K##_##RM##_1, ftile_##K##_##RM##_2}
#define FTILE_TAB(K) {FTILE_ROW(K, 1), FTILE_ROW(K, 2), FTILE_ROW(K, 3), FTILE_ROW(K, 4)}
static const ftile_fn k_ftiles[3][RM_F][RN_F] = {FTILE_TAB(F32), FTILE_TAB(F16), FTILE_TAB(BF16)};
#endif

#if NSTF_MATMUL_AVX2
static int quant_kind(nstf_type t) {
    switch (t) {
    case NSTF_TYPE_Q4_0: return KIND_Q4_0;
    case NSTF_TYPE_Q4_1: return KIND_Q4_1;
    case NSTF_TYPE_Q5_0: return KIND_Q5_0;
    case NSTF_TYPE_Q5_1: return KIND_Q5_1;
    case NSTF_TYPE_IQ4_NL: return KIND_IQ4_NL;
    default: return KIND_Q8_0;
    }
}
static int float_kind(nstf_type t) {
    return t == NSTF_TYPE_F32 ? KIND_F32 : t == NSTF_TYPE_F16 ? KIND_F16 : KIND_BF16;
}
#endif

enum { PATH_F, PATH_Q, PATH_K }; /* float weights, 32-element blocks, super-blocks */

static void run_tile(const mm_ctx *c, int64_t r0, int64_t t0, int64_t t_end) {
    int rm = (int)(c->n_out - r0 < c->rm ? c->n_out - r0 : c->rm);
    int rn = (int)(t_end - t0 < c->rn ? t_end - t0 : c->rn);
    const uint8_t *w = c->w + (uint64_t)r0 * c->row_bytes;
    float *y = c->y + t0 * c->n_out + r0;
    if (c->path == PATH_K) {
        nstf_mmk_tile(c->isa, c->wtype, w, c->row_bytes, rm, &c->xk, t0, rn, y, c->n_out);
    } else if (c->path == PATH_Q) {
        int64_t nb = c->xq.nb;
        const int8_t *xq = c->xq.q + t0 * nb * QK;
        const float *xd = c->xq.d + t0 * nb, *xs = c->xq.s + t0 * nb;
        const int32_t *xsum = c->xq.sum + t0 * nb;
#if NSTF_CPU_HAVE_AVX512
        if (c->vnni && rn >= 3) {
            k_qtiles_il[c->kind][rn - 3](w, c->row_bytes, rm, xq, xd, xs, xsum, nb, y, c->n_out);
            return;
        }
        if (c->isa == NSTF_ISA_AVX512) {
            k_qtiles512[c->kind][rn - 1](w, c->row_bytes, rm, xq, xd, xs, xsum, nb,
                                                      y, c->n_out);
            return;
        }
#endif
#if NSTF_MATMUL_AVX2
        if (c->isa != NSTF_ISA_SCALAR) {
            k_qtiles[c->kind][rn - 1](w, c->row_bytes, rm, xq, xd, xs, xsum, nb, y,
                                                   c->n_out);
            return;
        }
#endif
        tile_quant_scalar(c->wtype, rm, rn, w, c->row_bytes, xq, xd, xs, xsum, nb, y, c->n_out);
    } else {
        const float *x = c->x + t0 * c->n_in;
#if NSTF_MATMUL_AVX2
        if (c->isa != NSTF_ISA_SCALAR) {
            k_ftiles[c->kind][rm - 1][rn - 1](w, c->row_bytes, x, c->n_in, y, c->n_out);
            return;
        }
#endif
        tile_float_scalar(c->wtype, rm, rn, w, c->row_bytes, x, c->n_in, y, c->n_out);
    }
}

/* Threads split the row tiles (each keeps its weight rows hot) unless there
 * are too few of them, then the tokens. Inside, tokens go in chunks of
 * TOK_CHUNK so a chunk's activations stay in L1 while all of the thread's
 * rows pass over them. */
#define TOK_CHUNK 32
static void mm_worker(void *p, int ith, int nth) {
    const mm_ctx *c = p;
    int64_t n_rt = (c->n_out + c->rm - 1) / c->rm;
    int64_t r_lo = 0, r_hi = n_rt, t_lo = 0, t_hi = c->n_tok;
    if (n_rt >= 4 * nth || c->n_tok < 2 * nth * c->rn)
        nstf_split_range(n_rt, 1, ith, nth, &r_lo, &r_hi);
    else
        nstf_split_range(c->n_tok, c->rn, ith, nth, &t_lo, &t_hi);
    for (int64_t tc = t_lo; tc < t_hi; tc += TOK_CHUNK) {
        int64_t tc_hi = tc + TOK_CHUNK < t_hi ? tc + TOK_CHUNK : t_hi;
        for (int64_t rt = r_lo; rt < r_hi; rt++)
            for (int64_t t0 = tc; t0 < tc_hi; t0 += c->rn) run_tile(c, rt * c->rm, t0, tc_hi);
    }
}

static void quantize_worker(void *p, int ith, int nth) {
    const mm_ctx *c = p;
    int64_t lo, hi, nb = c->xq.nb;
    nstf_split_range(c->n_tok, 1, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        if (c->path == PATH_K)
            nstf_mmk_quantize_row(c->x + t * c->n_in, &c->xk, t);
        else
            quantize_x_row(c->x + t * c->n_in, c->xq.q + t * nb * QK, c->xq.d + t * nb,
                           c->xq.s + t * nb, c->xq.sum + t * nb, nb);
    }
}

/* Slow path for quantized weights when the arena is too small: dequantize
 * each weight block (32 or 256 values on the stack) and dot it with fp32 x. */
static void fallback_worker(void *p, int ith, int nth) {
    const mm_ctx *c = p;
    const int64_t be = nstf_type_block_elems(c->wtype), nb = c->n_in / be;
    uint64_t bbytes = (uint64_t)nstf_type_block_bytes(c->wtype);
    int64_t lo, hi;
    nstf_split_range(c->n_out, 1, ith, nth, &lo, &hi);
    for (int64_t o = lo; o < hi; o++) {
        const uint8_t *row = c->w + (uint64_t)o * c->row_bytes;
        for (int64_t t = 0; t < c->n_tok; t++) c->y[t * c->n_out + o] = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            float wb[NSTF_QK_K];
            nstf_dequantize_row(c->wtype, row + b * bbytes, wb, be);
            for (int64_t t = 0; t < c->n_tok; t++) {
                const float *xb = c->x + t * c->n_in + b * be;
                float s = 0.0f;
                for (int64_t j = 0; j < be; j++) s += wb[j] * xb[j];
                c->y[t * c->n_out + o] += s;
            }
        }
    }
}

/* The super-block types' q8k blocks in the arena (they need no more bytes
 * than the q8 blocks of the same shape, see nstf_mmk_bytes). */
static bool xk_carve(nstf_cpu *cpu, int64_t n_tok, int64_t n_in, nstf_q8k *xk) {
    uint64_t need;
    if (!cpu || !cpu->scratch || !nstf_mmk_bytes(n_tok, n_in, &need) || need > cpu->scratch_bytes)
        return false;
    nstf_mmk_carve(cpu->scratch, n_tok, n_in, xk);
    return true;
}

void nstf_cpu_matmul(nstf_cpu *cpu, nstf_type wtype, const void *w, const float *x, float *y,
                     int64_t n_tok, int64_t n_in, int64_t n_out) {
    if (n_tok <= 0 || n_out <= 0) return;
    nstf_pool *pool = cpu ? cpu->pool : NULL;
    mm_ctx c = {.wtype = wtype, .isa = nstf_cpu_isa_current(), .w = w, .x = x, .y = y,
                .n_tok = n_tok, .n_in = n_in, .n_out = n_out};
    c.vnni = c.isa == NSTF_ISA_AVX512 && nstf_cpu_has_vnni();
    c.path = nstf_mmk_type(wtype) ? PATH_K : nstf_type_is_quantized(wtype) ? PATH_Q : PATH_F;
#if NSTF_MATMUL_AVX2
    c.kind = c.path == PATH_Q ? quant_kind(wtype) : c.path == PATH_F ? float_kind(wtype) : 0;
#endif
    if (!nstf_type_valid((uint32_t)wtype) || n_in < 0 ||
        !nstf_type_row_bytes(wtype, n_in, &c.row_bytes)) {
        /* precondition broken (quantized n_in not a multiple of 32): make it loud */
        for (int64_t i = 0; i < n_tok * n_out; i++) y[i] = NAN;
        return;
    }
    if (nstf_type_is_quantized(wtype)) {
        if (nstf_mmk_type(wtype) ? !xk_carve(cpu, n_tok, n_in, &c.xk) : !xq_carve(cpu, n_tok, n_in, &c.xq)) {
            nstf_pool_run(pool, fallback_worker, &c);
            return;
        }
        c.rm = RM_Q;
        /* the VNNI tiles of the 32-element kinds hold 8 tokens (32 registers) */
        c.rn = c.vnni && c.path == PATH_Q ? RN_QIL : RN_Q;
        if (n_tok < 8 || nstf_pool_size(pool) == 1)
            quantize_worker(&c, 0, 1);
        else
            nstf_pool_run(pool, quantize_worker, &c);
    } else {
        c.rm = RM_F;
        c.rn = RN_F;
    }
    nstf_pool_run(pool, mm_worker, &c);
}
