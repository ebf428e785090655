/* matmul_k.c — tiles of the fast CPU matmul for the 256-element
 * super-block types (see matmul_k.h): q8k activation quantization, the
 * scalar kernel (every CPU; the model of the SIMD arithmetic), and the
 * SIMD kernels of matmul_k_impl.h instantiated for AVX2 and for AVX-512
 * (VL/BW, with VNNI's vpdpwssd where the CPU has it), picked at run time.
 *
 * Integer ranges (why nothing overflows): a maddubs pair sum is at most
 * 2 * 63 * 127 = 16002 (Q6_K codes 0..63; q8k values are in -127..127, never
 * -128, so the sign trick of IQ4_XS cannot overflow either: 2 * 127 * 127 =
 * 32258 < 32767); times a sub-block scale (|sc| <= 127) and summed over a
 * super-block, |sum| <= 256 * 63 * 127 * 127 < 2^31. bsums fit int16
 * (16 * 127). */
#include "ops/cpu/matmul_k.h"

#include <math.h>
#include <string.h>

#include "core/mem.h"

#if NSTF_CPU_HAVE_AVX2
#include <immintrin.h>
#endif

#define QK_K NSTF_QK_K

bool nstf_mmk_type(nstf_type t) {
    return t == NSTF_TYPE_Q2_K || t == NSTF_TYPE_Q3_K || t == NSTF_TYPE_Q4_K ||
           t == NSTF_TYPE_Q5_K || t == NSTF_TYPE_Q6_K || t == NSTF_TYPE_IQ4_XS;
}

static uint64_t align64(uint64_t v) { return (v + 63) & ~(uint64_t)63; }

bool nstf_mmk_bytes(int64_t n_tok, int64_t n_in, uint64_t *out) {
    if (n_tok < 0 || n_in < 0) return false;
    uint64_t nblk, q, d, bs, total;
    if (!nstf_mul_ok((uint64_t)n_tok, (uint64_t)(n_in / QK_K), &nblk) ||
        !nstf_mul_ok(nblk, QK_K, &q) || !nstf_mul_ok(nblk, 4, &d) || !nstf_mul_ok(nblk, 32, &bs))
        return false;
    if (!nstf_add_ok(align64(q), align64(d), &total) || !nstf_add_ok(total, align64(bs), &total))
        return false;
    return nstf_add_ok(total, 64, out);
}

void nstf_mmk_carve(void *base, int64_t n_tok, int64_t n_in, nstf_q8k *out) {
    uint64_t nblk = (uint64_t)n_tok * (uint64_t)(n_in / QK_K);
    char *p = (char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
    out->q = (int8_t *)p;
    out->d = (float *)(p + align64(nblk * QK_K));
    out->bsums = (int16_t *)(p + align64(nblk * QK_K) + align64(nblk * 4));
    out->nsb = n_in / QK_K;
}

/* Per block of 256: amax = max |x|, d = amax / 127, q = nearest-even(x *
 * (127 / amax)) (0 when amax == 0). The AVX2 version gives the same bits. */
void nstf_mmk_quantize_row(const float *x, const nstf_q8k *xq, int64_t t) {
    const int64_t nsb = xq->nsb;
    for (int64_t b = 0; b < nsb; b++) {
        const float *xb = x + b * QK_K;
        int8_t *q = xq->q + (t * nsb + b) * QK_K;
        int16_t *bs = xq->bsums + (t * nsb + b) * 16;
#if NSTF_CPU_HAVE_AVX2
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < QK_K; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        for (int i = 0; i < QK_K; i += 32) {
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i), vid));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8), vid));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 16), vid));
            __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 24), vid));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(q + i), p);
            /* sums of each 16: 16-bit pair sums then a horizontal fold */
            __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), p);   /* 16 x (q0+q1) */
            s16 = _mm256_hadd_epi16(s16, s16);                            /* 4 per 16 in each half */
            s16 = _mm256_hadd_epi16(s16, s16);
            s16 = _mm256_hadd_epi16(s16, s16);
            bs[i / 16] = (int16_t)_mm256_extract_epi16(s16, 0);
            bs[i / 16 + 1] = (int16_t)_mm256_extract_epi16(s16, 8);
        }
        xq->d[t * nsb + b] = amax / 127.0f;
#else
        float amax = 0.0f;
        for (int i = 0; i < QK_K; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int k = 0; k < 16; k++) {
            int s = 0;
            for (int i = 16 * k; i < 16 * k + 16; i++) {
                int v = (int)nearbyintf(xb[i] * id);
                q[i] = (int8_t)v;
                s += v;
            }
            bs[k] = (int16_t)s;
        }
        xq->d[t * nsb + b] = amax / 127.0f;
#endif
    }
}

/* ---- the integer form of a super-block (scalar path and model) ------------ */

static float h2f(const uint8_t *p) { return nstf_fp16_to_f32(nstf_load_u16(p)); }

void nstf_mmk_decode(nstf_type wt, const uint8_t *b, nstf_mmk_block *o) {
    memset(o->m, 0, sizeof o->m);
    o->dmin = 0.0f;
    switch (wt) {
    case NSTF_TYPE_Q2_K:
        o->d = h2f(b + 80);
        o->dmin = h2f(b + 82);
        for (int k = 0; k < 16; k++) {
            o->sc[k] = b[k] & 0xF;
            o->m[k] = b[k] >> 4;
        }
        for (int e = 0; e < QK_K; e++)
            o->q[e] = (int8_t)((b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3);
        break;
    case NSTF_TYPE_Q3_K: {
        int8_t sc[16];
        o->d = h2f(b + 108);
        nstf_q3k_scales(b + 96, sc);
        for (int k = 0; k < 16; k++) o->sc[k] = sc[k];
        for (int e = 0; e < QK_K; e++) {
            int n = e / 128, j = (e % 128) / 32, l = e % 32;
            int lo = (b[32 + 32 * n + l] >> (2 * j)) & 3, hi = (b[l] >> (4 * n + j)) & 1;
            o->q[e] = (int8_t)(lo - (hi ? 0 : 4));
        }
    } break;
    case NSTF_TYPE_Q4_K:
    case NSTF_TYPE_Q5_K: {
        const bool five = wt == NSTF_TYPE_Q5_K;
        o->d = h2f(b);
        o->dmin = h2f(b + 2);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            nstf_k4_scale_min(s, b + 4, &sc, &m);
            o->sc[2 * s] = o->sc[2 * s + 1] = sc;
            o->m[2 * s] = o->m[2 * s + 1] = m;
        }
        const uint8_t *qs = b + (five ? 48 : 16);
        for (int e = 0; e < QK_K; e++) {
            int j = e / 64, h = (e % 64) / 32, l = e % 32;
            int q = (qs[32 * j + l] >> (4 * h)) & 15;
            if (five) q |= ((b[16 + l] >> (2 * j + h)) & 1) << 4;
            o->q[e] = (int8_t)q;
        }
    } break;
    case NSTF_TYPE_Q6_K:
        o->d = h2f(b + 208);
        for (int k = 0; k < 16; k++) o->sc[k] = (int8_t)b[192 + k];
        for (int e = 0; e < QK_K; e++) {
            int n = e / 128, k = (e % 128) / 32, l = e % 32;
            int lo = (b[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
            o->q[e] = (int8_t)((lo | (((b[128 + 32 * n + l] >> (2 * k)) & 3) << 4)) - 32);
        }
        break;
    case NSTF_TYPE_IQ4_XS: {
        o->d = h2f(b);
        uint16_t sh = nstf_load_u16(b + 2);
        for (int s = 0; s < 8; s++) {
            int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) << 4);
            o->sc[2 * s] = o->sc[2 * s + 1] = (int16_t)(ls - 32);
            for (int j = 0; j < 16; j++) {
                o->q[32 * s + j] = nstf_iq4nl_values[b[8 + 16 * s + j] & 0xF];
                o->q[32 * s + j + 16] = nstf_iq4nl_values[b[8 + 16 * s + j] >> 4];
            }
        }
    } break;
    default: memset(o, 0, sizeof *o); break;
    }
}

static void tile_scalar(nstf_type wt, const uint8_t *w, uint64_t row_bytes, int rm,
                        const nstf_q8k *xq, int64_t t0, int rn, float *y, int64_t ldy) {
    const int64_t nsb = xq->nsb, bb = nstf_type_block_bytes(wt);
    nstf_mmk_block blk;
    for (int r = 0; r < rm; r++) {
        float acc[4] = {0, 0, 0, 0};
        for (int64_t b = 0; b < nsb; b++) {
            nstf_mmk_decode(wt, w + (uint64_t)r * row_bytes + (uint64_t)b * (uint64_t)bb, &blk);
            for (int t = 0; t < rn; t++) {
                const int64_t xb = (t0 + t) * nsb + b;
                const int8_t *q = xq->q + xb * QK_K;
                const int16_t *bs = xq->bsums + xb * 16;
                int32_t isum = 0, msum = 0;
                for (int k = 0; k < 16; k++) {
                    int32_t s = 0;
                    for (int i = 16 * k; i < 16 * k + 16; i++) s += blk.q[i] * q[i];
                    isum += blk.sc[k] * s;
                    msum += blk.m[k] * bs[k];
                }
                const float dx = xq->d[xb];
                acc[t] += (float)isum * (blk.d * dx) - (float)msum * (blk.dmin * dx);
            }
        }
        for (int t = 0; t < rn; t++) y[t * ldy + r] = acc[t];
    }
}

/* ---- SIMD instances -------------------------------------------------------- */
#if NSTF_CPU_HAVE_AVX2
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Q4_K / Q5_K: the 12 packed bytes -> 16 bytes {sc0..sc7, m0..m7}
 * (nstf_k4_scale_min for all 8 sub-blocks at once, on 32-bit words). */
static ALWAYS_INLINE __m128i k4_scales_mins(const uint8_t *p) {
    uint32_t u[3];
    memcpy(u, p, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    return _mm_setr_epi32((int)(u[0] & k1), (int)((u[2] & k2) | (((u[0] >> 6) & k3) << 4)),
                          (int)(u[1] & k1), (int)(((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4)));
}

#define KFN(name) name##_avx2
#define KTARGET
#define MADDS(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#include "ops/cpu/matmul_k_impl.h"
#undef KFN
#undef KTARGET
#undef MADDS

#if NSTF_CPU_HAVE_AVX512
#define KFN(name) name##_avx512
#define KTARGET NSTF_TARGET_AVX512
#define MADDS(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#include "ops/cpu/matmul_k_impl.h"
#undef KFN
#undef KTARGET
#undef MADDS

#define KFN(name) name##_vnni
#define KTARGET NSTF_TARGET_AVX512VNNI
#define MADDS(acc, p, s) _mm256_dpwssd_epi32((acc), (p), (s))
#include "ops/cpu/matmul_k_impl.h"
#undef KFN
#undef KTARGET
#undef MADDS
#endif
#endif

void nstf_mmk_tile(nstf_cpu_isa isa, nstf_type wt, const uint8_t *w, uint64_t row_bytes, int rm,
                   const nstf_q8k *xq, int64_t t0, int rn, float *y, int64_t ldy) {
#if NSTF_CPU_HAVE_AVX512
    if (isa == NSTF_ISA_AVX512) {
        if (nstf_cpu_has_vnni())
            ktile_vnni(wt, w, row_bytes, rm, xq, t0, rn, y, ldy);
        else
            ktile_avx512(wt, w, row_bytes, rm, xq, t0, rn, y, ldy);
        return;
    }
#endif
#if NSTF_CPU_HAVE_AVX2
    if (isa != NSTF_ISA_SCALAR) {
        ktile_avx2(wt, w, row_bytes, rm, xq, t0, rn, y, ldy);
        return;
    }
#endif
    (void)isa;
    tile_scalar(wt, w, row_bytes, rm, xq, t0, rn, y, ldy);
}
