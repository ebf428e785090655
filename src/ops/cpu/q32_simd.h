/* q32_simd.h — AVX2 helpers shared by the CPU matmul kernels of the
 * 32-element block types (matmul.c: 8-bit activations; matmul_i16.c: 16-bit
 * activations): unpacking a block's codes to bytes, loading the fp16
 * scales of 8 weight rows' blocks into one vector, the prefetch of the next
 * rows, and the tree that folds 8 rows' int32 sums into one vector.
 * Header-only (static inline), internal to src/ops/cpu; empty unless
 * NSTF_CPU_HAVE_AVX2. */
#ifndef NSTF_OPS_CPU_Q32_SIMD_H
#define NSTF_OPS_CPU_Q32_SIMD_H

#include <stdint.h>
#include <string.h>

#include "ops/cpu/cpu_isa.h"

#if NSTF_CPU_HAVE_AVX2
#include <immintrin.h>

/* 16 packed bytes -> 32 nibbles in element order (low nibbles = elements
 * 0..15, high nibbles = 16..31). */
static inline __attribute__((always_inline)) __m256i nstf_q32_nibbles(const uint8_t *qs) {
    /* same 16 bytes in both halves (a load), shift the upper half by 4 */
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    v = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* 32 bits -> 32 bytes, 0xFF where bit i of x is set (byte i). */
static inline __attribute__((always_inline)) __m256i nstf_q32_bits(uint32_t x) {
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x),
                                    _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                                       0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* The fp16 words at byte `off` of 8 rows' blocks: dv = the first (d) of
 * each row, *mv = the second (m, Q4_1 / Q5_1) when has_m. */
static inline __attribute__((always_inline)) __m256 nstf_q32_scales8(const uint8_t *const wr[8], uint64_t off,
                                                                     int has_m, __m256 *mv) {
    /* bytes {0,1,4,5,8,9,12,13} = low halves (d), {2,3,...} = high halves (m) */
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    uint32_t u[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) memcpy(&u[r], wr[r] + off, 4);
    __m256i h = _mm256_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3], (int)u[4], (int)u[5], (int)u[6],
                                  (int)u[7]);
    h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(h, split), 0xd8);
    if (has_m) *mv = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(h));
}

/* A tile's 8 row pointers: rows past rm repeat row rm - 1 (not stored). */
static inline __attribute__((always_inline)) void nstf_q32_rows8(const uint8_t *w, uint64_t row_bytes, int rm,
                                                                 const uint8_t *wr[8]) {
    for (int r = 0; r < 8; r++) wr[r] = w + (uint64_t)(r < rm ? r : rm - 1) * row_bytes;
}

/* Prefetch n bytes from p into L1 (decode: the next tile's weight rows at
 * the pace a tile consumes its own, so memory runs ahead of the arithmetic). */
static inline __attribute__((always_inline)) void nstf_q32_prefetch(const uint8_t *p, int n) {
#pragma GCC unroll 6
    for (int k = 0; k < n; k += 64) _mm_prefetch((const char *)p + k, _MM_HINT_T0);
}

/* v[r] lane c -> o[c] lane r: an 8 x 8 transpose of int32 lanes (the
 * interleaved weight rows of the VNNI tiles). */
static inline __attribute__((always_inline)) void nstf_q32_tr8(const __m256i v[8], __m256i o[8]) {
    __m256i a[8], b[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* per half: rows (2i, 2i+1) of columns (0,1) / (2,3) */
        a[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* rows 4h..4h+3: per half, columns 0..3 */
        b[4 * h] = _mm256_unpacklo_epi64(a[4 * h], a[4 * h + 2]);
        b[4 * h + 1] = _mm256_unpackhi_epi64(a[4 * h], a[4 * h + 2]);
        b[4 * h + 2] = _mm256_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
        b[4 * h + 3] = _mm256_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        o[c] = _mm256_permute2x128_si256(b[c], b[4 + c], 0x20);
        o[c + 4] = _mm256_permute2x128_si256(b[c], b[4 + c], 0x31);
    }
}

/* 8 vectors of int32 -> one vector whose lane r is the sum of p[r]'s lanes. */
static inline __attribute__((always_inline)) __m256i nstf_q32_reduce8_i32(const __m256i q[8]) {
    __m256i a[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) /* per half: rows (2r, 2r+1) x 2 */
        a[r] = _mm256_add_epi32(_mm256_unpacklo_epi32(q[2 * r], q[2 * r + 1]),
                                _mm256_unpackhi_epi32(q[2 * r], q[2 * r + 1]));
    /* per half: rows 0..3 and rows 4..7 */
    __m256i b0 = _mm256_add_epi32(_mm256_unpacklo_epi64(a[0], a[1]), _mm256_unpackhi_epi64(a[0], a[1]));
    __m256i b1 = _mm256_add_epi32(_mm256_unpacklo_epi64(a[2], a[3]), _mm256_unpackhi_epi64(a[2], a[3]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20), _mm256_permute2x128_si256(b0, b1, 0x31));
}
#endif

#endif
