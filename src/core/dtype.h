/* dtype.h — tensor element types, block layouts and scalar conversions.
 *
 * Type ids are GGUF's (ggml_type) so that a file's type id is used as is.
 * Blocks of 32 elements (byte offsets, all little-endian):
 *   Q8_0:   { fp16 d; int8  qs[32]; }                  x = d * q             (34 B)
 *   Q4_0:   { fp16 d; uint8 qs[16]; }                  x = d * (q - 8)       (18 B)
 *   Q4_1:   { fp16 d; fp16 m; uint8 qs[16]; }          x = d * q + m         (20 B)
 *   Q5_0:   { fp16 d; u32 qh; uint8 qs[16]; }          x = d * (q - 16)      (22 B)
 *   Q5_1:   { fp16 d; fp16 m; u32 qh; uint8 qs[16]; }  x = d * q + m         (24 B)
 *   IQ4_NL: { fp16 d; uint8 qs[16]; }                  x = d * kv[q]         (18 B)
 * where element j < 16 is the low nibble of qs[j] and element j + 16 its
 * high nibble; Q5_x add bit j of qh as bit 4 of element j; kv is the
 * 16-entry non-linear table nstf_iq4nl_values.
 * Super-blocks of 256 (the K-quants; sub-block scales are themselves
 * quantized, see dtype_k.c for the bit layouts):
 *   Q2_K   (84 B)  16 x 16, 2-bit q, 4-bit scale and min:   x = d*sc*q - dmin*m
 *   Q3_K  (110 B)  16 x 16, 3-bit q in -4..3, 6-bit scale:  x = d*(sc-32)*q
 *   Q4_K  (144 B)   8 x 32, 4-bit q, 6-bit scale and min:   x = d*sc*q - dmin*m
 *   Q5_K  (176 B)   8 x 32, 5-bit q, 6-bit scale and min:   x = d*sc*q - dmin*m
 *   Q6_K  (210 B)  16 x 16, 6-bit q - 32, int8 scale:       x = d*sc*(q - 32)
 *   IQ4_XS (136 B)  8 x 32, kv[4-bit q], 6-bit scale - 32:  x = d*(sc-32)*kv[q] */
#ifndef NSTF_CORE_DTYPE_H
#define NSTF_CORE_DTYPE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef enum nstf_type {
    NSTF_TYPE_F32 = 0,
    NSTF_TYPE_F16 = 1,
    NSTF_TYPE_Q4_0 = 2,
    NSTF_TYPE_Q4_1 = 3,
    NSTF_TYPE_Q5_0 = 6,
    NSTF_TYPE_Q5_1 = 7,
    NSTF_TYPE_Q8_0 = 8,
    NSTF_TYPE_Q2_K = 10,
    NSTF_TYPE_Q3_K = 11,
    NSTF_TYPE_Q4_K = 12,
    NSTF_TYPE_Q5_K = 13,
    NSTF_TYPE_Q6_K = 14,
    NSTF_TYPE_IQ4_NL = 20,
    NSTF_TYPE_IQ4_XS = 23,
    NSTF_TYPE_BF16 = 30,
} nstf_type;

#define NSTF_QK 32    /* elements per block of the 32-element types */
#define NSTF_QK_K 256 /* elements per K-quant super-block */

/* IQ4_NL / IQ4_XS code book (ggml's kvalues_iq4nl). */
extern const int8_t nstf_iq4nl_values[16];

typedef struct { uint16_t d; int8_t qs[NSTF_QK]; } nstf_block_q8_0;
typedef struct { uint16_t d; uint8_t qs[NSTF_QK / 2]; } nstf_block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[NSTF_QK / 2]; } nstf_block_q4_1;
_Static_assert(sizeof(nstf_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(nstf_block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(nstf_block_q4_1) == 20, "Q4_1 block is 20 bytes");

/* True for the types the engine supports (every id of nstf_type). */
bool nstf_type_valid(uint32_t type_id);
/* "F32", "Q4_1", ...; "?" for an unknown id. */
const char *nstf_type_name(uint32_t type_id);
/* Parse a name (case-insensitive). Returns false if unknown. */
bool nstf_type_from_name(const char *name, nstf_type *out);
/* Elements per block (1 for float types, 32 or 256 for quantized). */
int64_t nstf_type_block_elems(nstf_type t);
/* Bytes per block. */
int64_t nstf_type_block_bytes(nstf_type t);
/* Bytes of `n` elements; false if n is not a multiple of the block size or
 * the product overflows. */
bool nstf_type_row_bytes(nstf_type t, int64_t n, uint64_t *out);
/* True for the block-quantized types (not F32/F16/BF16). */
bool nstf_type_is_quantized(nstf_type t);
/* True if nstf_quantize_row can write type t. */
bool nstf_type_can_quantize(nstf_type t);

/* IEEE half <-> float, round-to-nearest-even. */
static inline float nstf_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
uint16_t nstf_f32_to_fp16(float f);

/* A 16-bit value at any address. Tensor data in a GGUF file need only be
 * 1-byte aligned (general.alignment may be 1), so block fields are read
 * through byte pointers, never through a block struct pointer. */
static inline uint16_t nstf_load_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* bfloat16 <-> float; float->bf16 rounds to nearest even, NaN stays NaN. */
static inline float nstf_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline uint16_t nstf_f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

/* Reference (scalar) conversions of `n` elements; n must be a multiple of
 * the type's block size. Dequantization computes exactly what ggml (and
 * gguf-py) compute, operation for operation in fp32. quantize follows
 * ggml's reference (non-imatrix) algorithms and rounding (IQ4_NL, IQ4_XS:
 * ggml's quantize_iq4_nl / _xs, their scale search included); it returns
 * false (dst untouched) for a type without a quantizer (none of the valid
 * types now: see nstf_type_can_quantize). */
void nstf_dequantize_row(nstf_type t, const void *src, float *dst, int64_t n);
bool nstf_quantize_row(nstf_type t, const float *src, void *dst, int64_t n);

/* Importance-weighted quantization (dtype_k.c): llama.cpp's
 * quantize_*_impl with quant_weights, qw [n] one weight per column (an
 * importance matrix: the mean squared activation feeding it). Q4_0,
 * Q4_1, Q5_0, Q5_1, Q2_K ... Q6_K use it; F32, F16, BF16 and Q8_0 take no
 * weights (as in ggml). qw NULL: nstf_quantize_row exactly. */
bool nstf_quantize_row_w(nstf_type t, const float *src, void *dst, int64_t n, const float *qw);
/* Q5_0 / Q5_1: five-bit codes q[32] -> qs nibbles and the qh bit word. */
void nstf_pack_q5(const int q[32], uint8_t *qh_out, uint8_t *qs);

/* The 256-element types, in dtype_k.c (called by the two above). */
void nstf_dequantize_row_k(nstf_type t, const uint8_t *src, float *dst, int64_t n);
bool nstf_quantize_row_k(nstf_type t, const float *src, uint8_t *dst, int64_t n);
/* Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12
 * packed scale bytes (ggml's get_scale_min_k4). */
static inline void nstf_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}
/* Q3_K: the 16 6-bit scales (minus 32) from the 12 packed bytes. */
static inline void nstf_q3k_scales(const uint8_t *p, int8_t out[16]) {
    for (int i = 0; i < 16; i++) {
        int lo = (p[i % 8] >> (4 * (i / 8))) & 0xF, hi = (p[8 + i % 4] >> (2 * (i / 4))) & 3;
        out[i] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

#endif
