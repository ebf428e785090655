/* matmul_k.h — the 256-element super-block types (Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K, IQ4_XS) in the fast CPU matmul: activation blocks and tiles.
 * Internal to src/ops/cpu (matmul.c schedules, matmul_k.c computes).
 *
 * Activations are quantized once per call into "q8k" blocks of 256 (as
 * ggml's Q8_K): int8 q[256] = nearest-even(x * 127 / amax), fp32
 * d = amax / 127, int16 bsums[16] (sums of q over each 16). A weight
 * super-block meets one q8k block in integer dot products per 16 or 32
 * values, weighted by the integer sub-block scales; the fp32 scales
 * d * d_x (and dmin * d_x times sum(m * bsums) for the types with mins)
 * are applied once per super-block. */
#ifndef NSTF_OPS_CPU_MATMUL_K_H
#define NSTF_OPS_CPU_MATMUL_K_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "ops/cpu/cpu_isa.h"

typedef struct {
    int8_t *q;      /* [n_tok][nsb * 256] */
    float *d;       /* [n_tok][nsb] */
    int16_t *bsums; /* [n_tok][nsb * 16] */
    int64_t nsb;    /* super-blocks per token */
} nstf_q8k;

/* True for the types computed here. */
bool nstf_mmk_type(nstf_type t);
/* Bytes of the q8k blocks of n_tok x n_in (n_in a multiple of 256), each
 * part 64-byte aligned; false on overflow. */
bool nstf_mmk_bytes(int64_t n_tok, int64_t n_in, uint64_t *out);
/* Carve the q8k parts from `base` (nstf_mmk_bytes(n_tok, n_in) bytes). */
void nstf_mmk_carve(void *base, int64_t n_tok, int64_t n_in, nstf_q8k *out);
/* Quantize one token's row x[nsb * 256] into block row t of xq. */
void nstf_mmk_quantize_row(const float *x, const nstf_q8k *xq, int64_t t);
/* y[t * ldy + r] = W[r] . x[t0 + t] for r < rm (rows of row_bytes from w)
 * and t < rn <= 4, at the given SIMD level. */
void nstf_mmk_tile(nstf_cpu_isa isa, nstf_type wt, const uint8_t *w, uint64_t row_bytes, int rm,
                   const nstf_q8k *xq, int64_t t0, int rn, float *y, int64_t ldy);

/* The integer form of one weight super-block that every kernel computes
 * with (scalar model, also used by the test): W[e] = d * sc[e/16] * q[e]
 * - dmin * m[e/16], with q the code as the dot product sees it (offsets
 * such as Q6_K's -32 applied). */
typedef struct {
    int8_t q[256];
    int16_t sc[16], m[16];
    float d, dmin;
} nstf_mmk_block;
void nstf_mmk_decode(nstf_type wt, const uint8_t *b, nstf_mmk_block *out);

#if NSTF_CPU_HAVE_AVX2
#include <immintrin.h>
#include <string.h>

/* Q3_K: the 12 packed bytes -> its 16 signed scales (nstf_q3k_scales on
 * two 64-bit words: the low nibbles of bytes 0..7, then their high
 * nibbles, each with two bits of bytes 8..11 on top, minus 32). The
 * scalar loop through a stack array cost more than the super-block's
 * vector work. Shared by matmul_k.c and matmul_i16.c. */
static inline __m128i nstf_q3k_scales16(const uint8_t *p) {
    uint64_t a;
    uint32_t h;
    memcpy(&a, p, 8);
    memcpy(&h, p + 8, 4);
    const uint64_t m4 = 0x0F0F0F0F0F0F0F0Full;
    const uint32_t m2 = 0x03030303u;
    const uint64_t h01 = (uint64_t)(h & m2) | ((uint64_t)((h >> 2) & m2) << 32);
    const uint64_t h23 = (uint64_t)((h >> 4) & m2) | ((uint64_t)((h >> 6) & m2) << 32);
    const uint64_t lo = (a & m4) | (h01 << 4), hi = ((a >> 4) & m4) | (h23 << 4);
    return _mm_sub_epi8(_mm_set_epi64x((long long)hi, (long long)lo), _mm_set1_epi8(32));
}

#endif

#endif
